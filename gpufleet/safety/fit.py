"""``python -m gpufleet.safety.fit [POLICY]``: embed a policy's exemplars, fit its head and write the fitted
state beside the policy file (:mod:`gpufleet.safety.fitted`; default: the packaged policy). Its own module, so
that :mod:`gpufleet.safety.fitted` (read by the prompt filter) does not import the filter back."""

from __future__ import annotations

import sys

from gpufleet.safety.fitted import fitted_path
from gpufleet.safety.policy import DEFAULT_POLICY_PATH, Policy
from gpufleet.safety.prompt_filter import PromptFilter


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    policy_path = args[0] if args else None
    pf = PromptFilter(Policy.load(policy_path or DEFAULT_POLICY_PATH), use_fitted=False)
    out = fitted_path(policy_path)
    pf.save_fitted(out)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
