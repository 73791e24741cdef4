"""Job specs and fired inputs round-trip on both backends with any data (issue 23, 'Any data'):
U+0000 and the store's escape character in a spec, a run's detail and the input a fire
enqueues are read back as written (``runtime/store/escaping.py``)."""

from __future__ import annotations

import itertools
from datetime import timedelta

import trio
from hypothesis import given

from tests.runtime.store._support import T0
from tests.runtime.store.test_any_data import MEGA, NAME, OBJECT, SETTINGS


async def test_job_specs_details_and_fired_inputs_round_trip(jobs, jobs_store):
    await jobs_store.create_session("s", owner="o")
    ids = itertools.count()

    @SETTINGS
    @given(spec=OBJECT, source=NAME, payload=OBJECT, detail=OBJECT)
    def prop(spec, source, payload, detail):
        job_id = f"j{next(ids)}"

        async def run():
            created = await jobs.create_job(
                job_id, kind="once", spec=spec, session_id="s", next_fire_at=T0
            )
            assert created.spec == spec == (await jobs.get_job(job_id)).spec
            fired = await jobs.fire_job(
                job_id, T0, T0 + timedelta(hours=1), input=(source, payload), detail=detail
            )
            assert fired is not None and fired.input is not None
            expected = payload | {"run_id": fired.run.id}  # the fire adds its run's id
            assert (fired.input.source, fired.input.payload) == (source, expected)
            stored = {i.id: i for i in await jobs_store.list_inputs("s")}[fired.input.id]
            assert (stored.source, stored.payload) == (source, expected)
            assert (await jobs.get_run(fired.run.id)).detail == detail

        trio.from_thread.run(run)

    await trio.to_thread.run_sync(prop)


async def test_a_one_megabyte_spec_round_trips(jobs, jobs_store):
    await jobs_store.create_session("s", owner="o")
    spec = {"prompt": MEGA, MEGA[:100]: [MEGA]}
    await jobs.create_job("j", kind="once", spec=spec, session_id="s", next_fire_at=T0)
    assert (await jobs.get_job("j")).spec == spec
