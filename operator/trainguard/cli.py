"""The `trainguard` command: dispatches each subcommand to the module that owns it.

Every subcommand module exposes ``main(argv: list[str]) -> int``. Modules are imported
lazily so that, for example, `trainguard supervise` never imports the Kubernetes client
and `trainguard operator` never imports PyTorch.
"""

from __future__ import annotations

import importlib
import sys

# subcommand -> (module, one-line help). Keep sorted by subcommand.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "agent": ("trainguard.agent.main", "the pod agent (native sidecar): watch, report, act"),
    "demo": ("trainguard.demo", "show trainguard at work on a local control plane"),
    "dev": ("trainguard.devcluster.cli", "local control plane for tests and the demo"),
    "preflight": ("trainguard.agent.preflight", "init step: test local disks and the GPU first"),
    "operator": ("trainguard.operator_main", "run the operator: reconcile TrainingRuns into pods"),
    "restore": ("trainguard.agent.shipper", "init step: bring the newest valid checkpoint into L1"),
    "stage-data": ("trainguard.agent.staging", "init step: copy the data to local disk, verified"),
    "status": ("trainguard.timeline", "a TrainingRun's timeline from its status and Events"),
    "supervise": ("trainguard_harness.supervisor", "run a training command under supervision"),
}


def _usage() -> str:
    lines = ["usage: trainguard <command> [options]", "", "commands:"]
    width = max(len(name) for name in SUBCOMMANDS)
    for name, (_, help_text) in sorted(SUBCOMMANDS.items()):
        lines.append(f"  {name.ljust(width)}  {help_text}")
    lines.append("")
    lines.append("Run `trainguard <command> --help` for a command's options.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the trainguard command line and return its exit status."""
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    if args[0] == "--version":
        from trainguard import __version__

        print(f"trainguard {__version__}")
        return 0
    entry = SUBCOMMANDS.get(args[0])
    if entry is None:
        print(f"trainguard: unknown command {args[0]!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(entry[0])
    result: int = module.main(args[1:])
    return result


if __name__ == "__main__":
    sys.exit(main())
