"""What a pod agent sends to the API, kept for the tests: its Lease renewals and its Events.

The agent's loop takes any client with `renew` and `event` (`trainguard.agent.kube` is the
real one); this one records instead of sending.
"""

from __future__ import annotations


class AgentApiRecorder:
    """Takes the agent's Lease renewals and Events."""

    def __init__(self) -> None:
        self.renewals: list[dict[str, str]] = []
        self.events: list[tuple[str, str, bool]] = []

    def renew(self, duration: int, annotations: dict[str, str]) -> None:
        """A renewal: its annotations, newest last."""
        self.renewals.append(annotations)

    def event(self, reason: str, message: str, warning: bool = False) -> None:
        """An Event: (reason, message, warning)."""
        self.events.append((reason, message, warning))

    @property
    def annotations(self) -> dict[str, str]:
        """The annotations of the newest renewal ({} before the first)."""
        return self.renewals[-1] if self.renewals else {}
