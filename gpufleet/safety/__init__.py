"""Safety: tier-1 prompt filter (before any GPU) and tier-2 frame moderation (in finalize).

``PromptFilter().check(prompt) -> PromptDecision`` is the interface the CheckPrompt
task calls (``PromptFilter.default()`` returns a process-wide instance).
Per-tenant tier-2 settings: :mod:`gpufleet.safety.profile` (stored by
:mod:`gpufleet.store.safety_profiles`, frozen onto each job at CheckPrompt).
"""

from gpufleet.safety import fitted
from gpufleet.safety.frames import FrameModerator, ModerationResult, SamplingPolicy, moderator
from gpufleet.safety.policy import Policy, default_policy
from gpufleet.safety.profile import FrozenSafety, SafetyProfile
from gpufleet.safety.prompt_filter import PromptDecision, PromptFilter

__all__ = [
    "FrameModerator",
    "FrozenSafety",
    "fitted",
    "ModerationResult",
    "Policy",
    "PromptDecision",
    "PromptFilter",
    "SafetyProfile",
    "SamplingPolicy",
    "default_policy",
    "moderator",
]
