"""A tune whose PostgreSQL run history goes away mid-search: a measured trial is kept and written when the
server returns, or the search stops with the trial's figures printed — never lost silently."""

from __future__ import annotations

import pytest
from test_store import fake_result

from workbench.store import Store
from workbench.store.throwaway_pg import ThrowawayPostgres
from workbench.tune.record import TuneRecord, UnsavedTrials


def test_trials_measured_while_the_server_is_away_are_written_when_it_returns_or_printed() -> None:
    with ThrowawayPostgres() as server:
        url = server.create_database()
        record = TuneRecord(url, {"workload": "w"}, resume=False)
        first, during, after, lost = (fake_result() for _ in range(4))
        record.save(first, "baseline")
        server.stop(remove=False)
        record.save(during, "screen")  # no error: kept for later
        assert [(r.trial_id, label) for r, label in record.unsaved] == [(during.trial_id, "screen")]
        assert "lost the connection" in record.store_failure or "nothing answers" in record.store_failure
        server.start()
        record.save(after, "screen")  # the kept one goes first, then this one
        assert record.unsaved == []
        with Store(url) as opened:
            stored = [(t.label, t.result.trial_id) for t in opened.trials(run_id=record.run_id)]
        assert stored == [("baseline", first.trial_id), ("screen", during.trial_id), ("screen", after.trial_id)]
        server.stop(remove=False)
        record.save(lost, "verification: amp=bf16")
        with pytest.raises(UnsavedTrials) as info:
            record.close()
        message = str(info.value)
        assert "1 measured trial(s) could not be written" in message and lost.trial_id in message
        assert "verification: amp=bf16" in message and "median 100.500 ms" in message
        assert [r.trial_id for r in info.value.results] == [lost.trial_id]


def test_a_study_server_gone_mid_trial_stops_the_tuner_with_the_trial_printed() -> None:
    from test_tune import _FakeMeasure, _result

    from workbench.config import TrainConfig
    from workbench.tune.objective import Objective
    from workbench.tune.screening import Screening, make_pruner, make_sampler
    from workbench.tune.space import user_space
    from workbench.tune.study import SharedStudy, StudyUnreachable

    space = user_space({"batch_size": [2, 4]}, "cpu")
    with ThrowawayPostgres() as server:
        url = server.create_database()
        shared = SharedStudy(
            url,
            "outage",
            {"workload": "w"},
            "cpu",
            resume=False,
            sampler=make_sampler(space, 0, shared=True),
            pruner=make_pruner(),
        )
        fake = _FakeMeasure()

        def measure_then_lose_the_server(config: TrainConfig, on_event: object, cancel: object) -> object:
            server.stop(remove=False)
            return fake(config, on_event, cancel)

        screening = Screening(
            space,
            TrainConfig(),
            _result(14.0),
            Objective("throughput"),
            measure_then_lose_the_server,
            device="cpu",
            shared=shared,
        )
        try:
            with pytest.raises(StudyUnreachable) as info:
                screening.step()
        finally:
            shared.close()
    message = str(info.value)
    assert "stopped answering" in message and info.value.result.trial_id in message
    assert '"batch_size":' in message and "median" in message
