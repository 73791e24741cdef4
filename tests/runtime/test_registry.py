"""Virtual actors: activation on first message, passivation when idle, state round trip."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from turnstile.runtime.actor import Actor
from turnstile.runtime.errors import PlacedElsewhere
from turnstile.runtime.registry import Registry
from turnstile.runtime.supervisor import open_supervisor


class Account(Actor):
    """Keeps a balance in a dict that stands in for the store."""

    def __init__(self, key: str, store: dict, log: list) -> None:
        self.key = key
        self.store = store
        self.log = log
        self.balance = 0

    async def on_start(self) -> None:
        await trio.sleep(0.01)  # a load takes time
        self.balance = self.store.get(self.key, 0)
        self.log.append(("activate", self.key, self.balance))

    async def on_stop(self) -> None:
        await trio.sleep(0.5)  # so does a save: a new activation must wait for it
        self.store[self.key] = self.balance
        self.log.append(("passivate", self.key, self.balance))

    async def receive(self, message):
        if message == "boom":
            raise RuntimeError("boom")
        self.balance += message
        return self.balance


async def open_registry(sup, store, log, idle=10.0):
    registry = Registry(sup, idle_timeout=idle)
    registry.register("account", lambda key: Account(key, store, log))
    return registry


async def test_first_message_activates_and_idle_passivates_with_state_saved(autojump_clock):
    store: dict = {}
    log: list = []
    async with open_supervisor("actors", escalate=False) as sup:
        registry = await open_registry(sup, store, log)
        ref = registry.ref("account:alice")
        assert not registry.is_active("account:alice")
        assert await ref.ask(5) == 5
        assert registry.is_active("account:alice")
        await trio.sleep(9)
        assert await ref.ask(1) == 6  # activity resets the idle timer
        await trio.sleep(11)
        assert not registry.is_active("account:alice")
        assert store == {"account:alice".split(":")[1]: 6}
        assert await ref.ask(4) == 10  # reactivated from saved state
        stats = registry.statistics()
        assert (stats.activations, stats.passivations) == (2, 1)
    assert log == [
        ("activate", "alice", 0),
        ("passivate", "alice", 6),
        ("activate", "alice", 6),
        ("passivate", "alice", 10),
    ]


async def test_message_during_passivation_waits_for_the_save(autojump_clock):
    store: dict = {}
    log: list = []
    async with open_supervisor("actors", escalate=False) as sup:
        registry = await open_registry(sup, store, log, idle=1.0)
        ref = registry.ref("account:bob")
        await ref.tell(3)
        await trio.sleep(1.2)  # idle fired; on_stop is still saving (takes 0.5 s)
        assert registry.statistics().passivating == 1
        assert await ref.ask(2) == 5  # the new activation loaded what the old one saved
    assert log[:3] == [("activate", "bob", 0), ("passivate", "bob", 3), ("activate", "bob", 3)]


async def test_concurrent_first_messages_activate_once():
    store: dict = {}
    log: list = []
    async with open_supervisor("actors", escalate=False) as sup:
        registry = await open_registry(sup, store, log)
        ref = registry.ref("account:carol")
        async with trio.open_nursery() as nursery:
            for _ in range(50):
                nursery.start_soon(ref.tell, 1)
        assert await ref.ask(0) == 50
        assert registry.statistics().activations == 1


async def test_a_crashing_actor_restarts_without_touching_the_others(autojump_clock):
    store: dict = {}
    log: list = []
    async with open_supervisor("actors", escalate=False) as sup:
        registry = await open_registry(sup, store, log)
        a, b = registry.ref("account:a"), registry.ref("account:b")
        await a.tell(1)
        await b.tell(7)
        await a.tell("boom")
        assert await a.ask(1) == 1  # fresh incarnation, state as loaded (nothing saved)
        assert await b.ask(0) == 7


async def test_unknown_kind_and_bad_address_are_lookup_errors():
    async with open_supervisor("actors", escalate=False) as sup:
        registry = Registry(sup)
        with pytest.raises(LookupError, match="^no actor kind 'nope' registered$"):
            registry.ref("nope:1")
        with pytest.raises(LookupError, match="^address must look like 'kind:key', got 'x'$"):
            registry.ref("x")
        with pytest.raises(ValueError, match="^kind must be non-empty without ':', got 'a:b'$"):
            registry.register("a:b", Actor)


async def test_passivated_actors_leave_nothing_in_the_registry(autojump_clock):
    async with open_supervisor("actors", escalate=False) as sup:
        registry = await open_registry(sup, {}, [], idle=1.0)
        for i in range(200):
            await registry.ref(f"account:{i}").tell(1)
        assert registry.statistics().active == 200
        await trio.sleep(5)
        stats = registry.statistics()
        assert (stats.active, stats.passivating) == (0, 0)
        assert sup.children == []


class Lease:
    """A placement that holds some addresses elsewhere and records what it was told."""

    def __init__(self, elsewhere: dict[str, str]) -> None:
        self.elsewhere = elsewhere
        self.claimed: list[str] = []
        self.released_: list[str] = []

    async def claim(self, address: str) -> None:
        await trio.sleep(0.05)  # a lease is a round trip to the database
        if address in self.elsewhere:
            raise PlacedElsewhere(address, self.elsewhere[address])
        self.claimed.append(address)

    def released(self, address: str) -> None:
        self.released_.append(address)


async def test_a_placement_is_asked_before_activation_and_told_when_it_ends(autojump_clock):
    store: dict = {}
    log: list = []
    lease = Lease({"account:bob": "node-2"})
    async with open_supervisor("actors", escalate=False) as sup:
        registry = Registry(sup, idle_timeout=10.0, placement=lease)
        registry.register("account", lambda key: Account(key, store, log))
        # two senders race for one address: one claim, one activation
        async with trio.open_nursery() as nursery:
            for _ in range(2):
                nursery.start_soon(registry.ref("account:alice").ask, 1)
        assert lease.claimed == ["account:alice"]
        assert [entry[0] for entry in log] == ["activate"]
        with pytest.raises(PlacedElsewhere) as refused:
            await registry.ref("account:bob").ask(1)
        assert refused.value.node == "node-2"
        assert not registry.is_active("account:bob") and "bob" not in store
        assert lease.released_ == []
        await trio.sleep(11)  # idle: passivated, and the placement hears of it
        assert lease.released_ == ["account:alice"]
        assert await registry.ref("account:alice").ask(1) == 3  # claimed again, state kept
        assert lease.claimed == ["account:alice", "account:alice"]


async def test_without_a_placement_every_address_activates_here(autojump_clock):
    async with open_supervisor("actors", escalate=False) as sup:
        registry = await open_registry(sup, {}, [])
        registry.ref("account:carol").tell_nowait(1)  # no claim to wait for: at once
        assert registry.is_active("account:carol")


class Quitter(Account):
    """Stops itself on "quit" (as a session does when it is deleted or its lease moved)."""

    async def receive(self, message):
        if message == "quit":
            self.ref.stop_nowait()
            return "bye"
        return await super().receive(message)


async def test_an_actor_that_stops_itself_is_replaced_only_once_it_is_gone(autojump_clock):
    """A message for an address whose actor is stopping itself waits for it (its on_stop
    saves), then activates a new one: never two at once (the supervisor would refuse the
    second with 'already running', and a placement would be told of an overlap)."""
    store: dict = {}
    log: list = []
    lease = Lease({})
    async with open_supervisor("actors", escalate=False) as sup:
        registry = Registry(sup, idle_timeout=10.0, placement=lease)
        registry.register("account", lambda key: Quitter(key, store, log))
        ref = registry.ref("account:alice")
        assert await ref.ask(4) == 4
        assert await ref.ask("quit") == "bye"
        assert await ref.ask(1) == 5  # the new activation loaded what the old one saved
        assert [entry[0] for entry in log] == ["activate", "passivate", "activate"]
        assert lease.released_ == ["account:alice"]
