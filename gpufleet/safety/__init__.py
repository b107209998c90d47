"""Safety: tier-1 prompt filter (before any GPU) and tier-2 frame moderation (in finalize).

``PromptFilter().check(prompt) -> PromptDecision`` is the interface the CheckPrompt
task calls (``PromptFilter.default()`` returns a process-wide instance).
"""

from gpufleet.safety.frames import FrameModerator, ModerationResult, SamplingPolicy, moderator
from gpufleet.safety.policy import Policy, default_policy
from gpufleet.safety.prompt_filter import PromptDecision, PromptFilter

__all__ = ["FrameModerator", "ModerationResult", "Policy", "PromptDecision", "PromptFilter", "SamplingPolicy",
           "default_policy", "moderator"]
