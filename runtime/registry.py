"""Virtual actors: an address resolves to an actor that exists whenever it is needed.

As with Orleans grains and Dapr actors, a sender never creates or looks after the actor behind
``session:42``: the first message activates it (its ``on_start`` loads state from the store),
and after ``idle_timeout`` seconds without a message it is passivated (its ``on_stop`` saves
state, and its memory is freed; nothing is left in the registry). The next message activates a
fresh one. An activation never overlaps its predecessor's ``on_stop``: the new one starts only
after the old one has saved.

Activations run under a supervisor that restarts a crashed actor over the same mailbox and
gives up on one that keeps crashing without disturbing any other.

Where an address may be activated is a placement's decision (``Placement``). On one node there
is none to ask: every address lives here, and the registry pays nothing for the seam. A
placement for several nodes (a lease row per session, with an epoch) claims an address before
its first activation here, or raises ``PlacedElsewhere`` naming the node that holds it, and
hears when the activation is gone, so it can give the lease up.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import trio

from turnstile.runtime.actor import Actor, ActorCell, ActorRef
from turnstile.runtime.errors import ActorStopped, PlacedElsewhere
from turnstile.runtime.supervisor import Supervisor

__all__ = ["Placement", "PlacedElsewhere", "Registry", "RegistryStatistics", "VirtualRef"]


class Placement(Protocol):
    """Decides which node activates an address (the seam for running several nodes).

    ``claim`` is awaited before an address is activated here; ``released`` is called once that
    activation is gone (passivated, stopped, or given up on).
    """

    async def claim(self, address: str) -> None:
        """Make ``address`` this node's to activate, or raise.

        Raises:
            PlacedElsewhere: another node holds it.
        """
        ...

    def released(self, address: str) -> None:
        """This node's activation of ``address`` has ended."""
        ...


@dataclass(frozen=True)
class RegistryStatistics:
    """A snapshot of the registry.

    Attributes:
        active: live activations.
        passivating: activations saving their state on the way out.
        activations: activations since the registry opened.
        passivations: idle passivations since the registry opened.
    """

    active: int
    passivating: int
    activations: int
    passivations: int


class VirtualRef:
    """A ref to ``kind:key`` that activates the actor when a message needs it."""

    __slots__ = ("address", "_registry")

    def __init__(self, address: str, registry: Registry) -> None:
        self.address = address
        self._registry = registry

    def __repr__(self) -> str:
        return f"<VirtualRef {self.address}>"

    async def tell(self, message: object) -> None:
        """Deliver ``message``, activating the actor if needed; waits while its mailbox is full."""
        ref = await self._registry._resolve(self.address)
        await ref.tell(message)

    def tell_nowait(self, message: object) -> None:
        """Deliver ``message`` or raise ``MailboxFull``; activates the actor if needed.

        Raises:
            WouldBlockActivation: the previous activation is still saving its state
                (use ``tell`` to wait for it).
        """
        self._registry._resolve_nowait(self.address).tell_nowait(message)

    async def ask(self, message: object) -> Any:
        """Request/reply, activating the actor if needed."""
        ref = await self._registry._resolve(self.address)
        return await ref.ask(message)

    async def deactivate(self) -> None:
        """Passivate the actor now if it is active (its ``on_stop`` runs); else do nothing."""
        await self._registry.deactivate(self.address)


class Registry:
    """Maps ``kind:key`` addresses to virtual actors.

    Args:
        supervisor: where activations run; give it ``escalate=False`` so one actor that keeps
            crashing is dropped instead of taking the others down.
        idle_timeout: seconds without a message before an actor is passivated.
        mailbox_size: each activation's mailbox bound.
        placement: where addresses may be activated; None (one node) activates every address
            here without asking anyone.
    """

    def __init__(
        self,
        supervisor: Supervisor,
        *,
        idle_timeout: float = 300.0,
        mailbox_size: int = 1000,
        placement: Placement | None = None,
    ) -> None:
        if idle_timeout <= 0:
            raise ValueError("idle_timeout must be > 0")
        self._supervisor = supervisor
        self._factories: dict[str, Callable[[str], Actor]] = {}
        self._live: dict[str, ActorCell] = {}
        self._passivating: dict[str, ActorCell] = {}
        self.idle_timeout = idle_timeout
        self.mailbox_size = mailbox_size
        self._activations = 0
        self._passivations = 0
        self._placement = placement
        self._claiming: dict[str, trio.Event] = {}

    def register(self, kind: str, factory: Callable[[str], Actor]) -> None:
        """Declare how to build an actor of ``kind`` from its key.

        Raises:
            ValueError: ``kind`` is empty, contains ``:``, or is already registered.
        """
        if not kind or ":" in kind:
            raise ValueError(f"kind must be non-empty without ':', got {kind!r}")
        if kind in self._factories:
            raise ValueError(f"kind {kind!r} is already registered")
        self._factories[kind] = factory

    def ref(self, address: str) -> VirtualRef:
        """A ref to ``kind:key``. Cheap: nothing is activated until a message is sent.

        Raises:
            LookupError: the kind is not registered, or the address has no ``:``.
        """
        self._split(address)
        return VirtualRef(address, self)

    async def resolve(self, address: str) -> ActorRef:
        """The live actor behind ``address``, activating it if needed.

        Raises:
            LookupError: the kind is not registered, or the address is malformed.
        """
        self._split(address)
        return await self._resolve(address)

    def mailbox_depth(self) -> int:
        """Messages waiting in every live activation's mailbox, together."""
        return sum(len(cell.mailbox) for cell in self._live.values())

    def is_active(self, address: str) -> bool:
        """True while an activation for ``address`` is live."""
        return address in self._live

    def statistics(self) -> RegistryStatistics:
        """A snapshot of activation counts."""
        return RegistryStatistics(
            active=len(self._live),
            passivating=len(self._passivating),
            activations=self._activations,
            passivations=self._passivations,
        )

    def active(self, kind: str) -> list[str]:
        """The addresses of ``kind`` with a live activation here, sorted."""
        return sorted(a for a in self._live if a.partition(":")[0] == kind)

    async def deactivate(self, address: str) -> None:
        """Passivate ``address`` now (graceful: queued messages first). No-op if inactive."""
        cell = self._live.get(address)
        if cell is not None:
            self._begin_passivation(cell)
            await cell.wait_stopped()

    def _split(self, address: str) -> tuple[str, str]:
        kind, sep, key = address.partition(":")
        if not sep or not key:
            raise LookupError(f"address must look like 'kind:key', got {address!r}")
        if kind not in self._factories:
            raise LookupError(f"no actor kind {kind!r} registered")
        return kind, key

    async def _resolve(self, address: str) -> ActorRef:
        while True:
            cell = self._live.get(address)
            if cell is not None:
                if not cell.mailbox.closed:
                    return cell.ref
                await cell.wait_stopped()  # it stops itself (deleted, fenced): start after it
                continue
            saving = self._passivating.get(address)
            if saving is not None:
                await saving.wait_stopped()  # the old activation is saving; start after it
                continue
            if self._placement is None:
                return self._activate(address)
            claiming = self._claiming.get(address)
            if claiming is not None:  # one claim at a time per address; then look again
                await claiming.wait()
                continue
            self._claiming[address] = claiming = trio.Event()
            try:
                await self._placement.claim(address)  # raises PlacedElsewhere
            finally:
                del self._claiming[address]
                claiming.set()
            return self._activate(address)

    def _resolve_nowait(self, address: str) -> ActorRef:
        cell = self._live.get(address)
        if cell is not None and not cell.mailbox.closed:
            return cell.ref
        if address in self._passivating:
            raise ActorStopped(f"{address} is passivating; use tell() to wait for it")
        if self._placement is not None:  # a claim may have to wait on another node
            raise ActorStopped(f"{address} is not active here; use tell() to place it")
        return self._activate(address)

    def _activate(self, address: str) -> ActorRef:
        kind, key = self._split(address)
        factory = self._factories[kind]
        ref = self._supervisor.spawn_soon(
            lambda: factory(key),
            name=address,
            mailbox_size=self.mailbox_size,
            idle_timeout=self.idle_timeout,
            on_idle=self._begin_passivation,
        )
        cell = ref._cell
        cell.on_finish = self._forget
        self._live[address] = cell
        self._activations += 1
        return ref

    def _begin_passivation(self, cell: ActorCell) -> bool:
        """Called synchronously by an idle actor: take it out of the routing table."""
        address = cell.name
        if self._live.get(address) is cell:
            del self._live[address]
            self._passivating[address] = cell
            self._passivations += 1
        cell.request_stop()
        return True

    def _forget(self, cell: ActorCell) -> None:
        """The activation is gone (passivated, stopped or given up on): unroute it."""
        address = cell.name
        if self._live.get(address) is cell:
            del self._live[address]
        if self._passivating.get(address) is cell:
            del self._passivating[address]
        if self._placement is not None and address not in self._live:
            self._placement.released(address)
