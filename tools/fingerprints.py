"""Check, or re-record, the framework code the fused paths were verified against (a maintenance command,
outside the installed package): ``python -m tools.fingerprints [--update]``, after the equivalence tests pass."""

from __future__ import annotations

import argparse

from rlaccel_plugins.fused.fingerprints import adapters_code, load_record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.fingerprints",
                                     description="Check or re-record the framework code the fused paths were "
                                                 "verified against (run the equivalence tests first).")
    parser.add_argument("--update", action="store_true", help="re-record the installed code's fingerprints")
    args = parser.parse_args(argv)
    stale = 0
    for name, code in adapters_code().items():
        previous = load_record(code.record_path)
        if args.update:
            code.record(previous if code.record_path.exists() else None).save(code.record_path)
            print(f"{name}: recorded {sum(len(r.targets) for r in code.replacements.values())} fingerprints "
                  f"in {code.record_path}")
            continue
        for key in code.replacements:
            changed = code.differences(key, previous)
            stale += bool(changed)
            print(f"{name} {key}: " + ("verified" if not changed else "DIFFERS: " + ", ".join(changed)))
    return 1 if stale else 0


if __name__ == "__main__":
    raise SystemExit(main())
