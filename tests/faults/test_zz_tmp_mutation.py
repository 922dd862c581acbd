import pytest
from django_pgjobs import sql
from tests.faults import test_state_machine as m

@pytest.mark.parametrize("name,old", [("JOB_HEARTBEAT", "AND j.lease = f.lease")])
def test_mutant(db, cluster, monkeypatch, name, old):
    assert old in getattr(sql, name)
    monkeypatch.setattr(sql, name, getattr(sql, name).replace(old, ""))
    with pytest.raises(AssertionError):
        m.test_random_interleavings_keep_the_invariants(db, cluster)
