"""`%gpu status` and `%gpu offers` mention the reservations a user may use (issue 27)."""

from __future__ import annotations

import time

from tests.kernel.conftest import ROOT


def test_status_and_offers_say_how_much_of_a_reservation_is_free(service, start_kernel):
    now = time.time()
    service.call("POST", "reservations", {"name": "ml101", "users": ["alice"], "spec": {"kind": "mig", "profile":
                 "1g.5gb"}, "count": 3, "start": now - 60, "end": now + 3600}, token=ROOT)
    kernel = start_kernel()
    offers = kernel.run("%gpu offers").stdout
    assert "  ml101 reservation: 3 of 3 free until " in offers
    granted = kernel.run("%gpu request --mig 1g.5gb")
    assert granted.stdout.startswith("gpu: granted"), granted
    status = kernel.run("%gpu status")
    text = status.displays[0]["text/plain"]
    assert "time limit: until " in text and "from reservation ml101: it ends with the reservation's window" in text
    assert "  ml101 reservation: 2 of 3 free until " in status.stdout
    kernel.run("%gpu release")
    service.call("DELETE", "reservations/ml101", token=ROOT)
