"""The `kiln` command: `kiln bench ...` (the benchmark harness), `kiln report ...` and `kiln doctor`."""
from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: kiln bench [options]   (kiln bench --help for the options)\n"
              "       kiln report [-o OUT.html] TRACE_DIR | kiln report [-o OUT.html] -- COMMAND ARGS\n"
              "       kiln doctor                  (versions, and a tiny compile on each device)")
        return 0
    command, rest = argv[0], argv[1:]
    if command == "bench":
        from kiln.bench.__main__ import main as bench_main
        return bench_main(rest)
    if command == "doctor":
        from kiln.doctor import main as doctor_main
        return doctor_main(rest)
    if command == "report":
        from kiln.report import main as report_main
        return report_main(rest)
    print(f"kiln: unknown command {command!r}; try 'kiln --help'", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
