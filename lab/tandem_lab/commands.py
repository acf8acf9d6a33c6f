"""The lab's top-level ``tandem`` commands, one ``register`` per entry point (``tandem.commands``).

Why one function per command rather than one per module: ``sim`` and ``bench`` each gather sub-commands
from several modules in different layers (the pure simulator and the local-cluster kit), and argparse
allows one parser per top-level command; the order below is the order they must register in. Imports
are lazy so that ``tandem sim --help`` does not load the cluster kit and vice versa.
"""

from __future__ import annotations

from typing import Any


def sim(subparsers: Any) -> None:
    """``tandem sim``: the fleet simulator, then ``sim live`` (which adds a sub-command to ``sim``)."""
    from tandem_lab.dev import simlive  # noqa: PLC0415
    from tandem_lab.sim import cli  # noqa: PLC0415

    cli.register(subparsers)
    simlive.register(subparsers)


def bench(subparsers: Any) -> None:
    """``tandem bench``: fleet (simulator), controller (local cluster) and router benchmarks."""
    from tandem_lab.dev import benchctl, routerbench  # noqa: PLC0415
    from tandem_lab.sim import bench as fleet  # noqa: PLC0415

    fleet.register(subparsers)
    benchctl.register(subparsers)
    routerbench.register(subparsers)


def demo(subparsers: Any) -> None:
    """``tandem demo``: the local-cluster demo."""
    from tandem_lab.dev import demo as demo_module  # noqa: PLC0415

    demo_module.register(subparsers)


def dev(subparsers: Any) -> None:
    """``tandem dev``: the local control plane (cluster up/down/status)."""
    from tandem_lab.dev import cli  # noqa: PLC0415

    cli.register(subparsers)
