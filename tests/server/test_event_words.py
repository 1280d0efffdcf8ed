"""The sentences the server extension puts on lease events (the sidebar's toasts): who holds the
slice in words a user knows, a verb that reads as English, and no reason that repeats the verb."""

from __future__ import annotations

from jupyter_gpualloc.kernel.status import end_text
from jupyter_gpualloc.server.events import holder_words, lease_message


def test_holders_are_named_as_the_user_knows_them():
    assert holder_words("server") == "this server"
    assert holder_words("server:gpu-box") == "server gpu-box"
    assert holder_words("kernel:8f2c") == "kernel 8f2c"  # the sidebar puts the notebook's name there
    assert holder_words("job:01b9a677245b") == "job 01b9a677245b"


def test_each_end_reads_as_a_sentence_without_repeating_itself():
    assert lease_message("lease.released", "server", {"reason": "released by alice"}) == (
        "The GPU slice of this server was released by alice.")
    assert lease_message("lease.released", "kernel:8f2c", {"reason": "its kernel shut down"}) == (
        "The GPU slice of kernel 8f2c was released: its kernel shut down.")
    assert lease_message("lease.expired", "kernel:8f2c", {"reason": "reached its maximum duration of 20s"}) == (
        "The GPU slice of kernel 8f2c expired: reached its maximum duration of 20s.")
    assert lease_message("lease.preempted", "job:j1", {"reason": "preempted for an interactive request"}) == (
        "The GPU slice of job j1 was preempted for an interactive request.")
    assert lease_message("lease.cancelled", "kernel:8f2c", {}) == "The GPU request of kernel 8f2c was withdrawn."
    assert lease_message("lease.rejected", "server", {"reason": "no capacity"}) == (
        "The GPU request of this server was refused: no capacity.")
    assert lease_message("lease.queued", "kernel:8f2c", {"position": 2}) == (
        "The GPU request of kernel 8f2c is queued at position 2.")
    assert lease_message("lease.granted", "server", {"slice": {"visible_devices": "MIG-1"}}) == (
        "This server got its GPU slice (MIG-1).")


def test_the_kernel_says_how_a_lease_ended_once():
    assert end_text("released", "released by alice") == "released by alice"
    assert end_text("preempted", "preempted for an interactive request") == "preempted for an interactive request"
    assert end_text("expired", "idle for 1900 s") == "expired: idle for 1900 s"
    assert end_text("released", None) == "released"
