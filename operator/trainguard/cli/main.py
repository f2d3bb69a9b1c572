"""The `trainguard` command: dispatches each subcommand to the module that owns it.

Every subcommand module exposes ``main(argv: list[str]) -> int``. Modules are imported
lazily so that, for example, `trainguard supervise` never imports the Kubernetes client
and `trainguard operator` never imports PyTorch. Other distributions add subcommands through
the `trainguard.commands` entry points (the development tools add `dev` and `demo`); a
command whose program's dependencies are not installed says which extra to install.
"""

from __future__ import annotations

import importlib
import sys
from importlib.metadata import entry_points

ENTRY_POINT_GROUP = "trainguard.commands"
# subcommand -> (module, one-line help). Keep sorted by subcommand.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "agent": ("trainguard.agent.main", "the pod agent (native sidecar): watch, report, act"),
    "operator": ("trainguard.operator.main", "run the operator: reconcile TrainingRuns into pods"),
    "preflight": ("trainguard.initsteps.preflight", "init step: test local disks and the GPU"),
    "restore": ("trainguard.initsteps.restore", "init step: bring the newest valid checkpoint"),
    "stage-data": ("trainguard.initsteps.stage_data", "init step: copy the data to local disk"),
    "status": ("trainguard.cli.status", "a TrainingRun's timeline from its status and Events"),
    "supervise": ("trainguard_harness.supervisor", "run a training command under supervision"),
}
# The extra that brings a package a program needs beyond the base install.
EXTRA_OF_PACKAGE = {
    "kopf": "operator",
    "kubernetes": "operator",
    "prometheus_client": "operator",
    "boto3": "operator",
    "paramiko": "operator",
    "huggingface_hub": "operator",
    "torch": "trainer",
}


def commands() -> dict[str, tuple[str, str]]:
    """The built-in subcommands and those that other installed distributions add."""
    found = dict(SUBCOMMANDS)
    for entry in entry_points(group=ENTRY_POINT_GROUP):
        origin = entry.dist.name if entry.dist is not None else "a plugin"
        found.setdefault(entry.name, (entry.value, f"(from {origin})"))
    return found


def _usage() -> str:
    lines = ["usage: trainguard <command> [options]", "", "commands:"]
    known = commands()
    width = max(len(name) for name in known)
    for name, (_, help_text) in sorted(known.items()):
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
    entry = commands().get(args[0])
    if entry is None:
        print(f"trainguard: unknown command {args[0]!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    try:
        module = importlib.import_module(entry[0])
    except ModuleNotFoundError as err:
        extra = EXTRA_OF_PACKAGE.get((err.name or "").split(".")[0])
        if extra is None:
            raise
        print(
            f"trainguard {args[0]}: needs {err.name}, which this install lacks: "
            f"pip install 'trainguard[{extra}]'",
            file=sys.stderr,
        )
        return 2
    result: int = module.main(args[1:])
    return result


if __name__ == "__main__":
    sys.exit(main())
