"""Forwarded client address and scheme: believed from trusted proxies only, never a crash."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
from tornado.httputil import HTTPHeaders, HTTPServerRequest, RequestStartLine

from jupyter_gpualloc.service.app import LOOPBACK, ForwardedHeaders

from .conftest import ServiceProcess


def forwarded(peer: str, headers: dict[str, str], trusted=LOOPBACK) -> HTTPServerRequest:
    """A tornado request from `peer` with `headers`, after the service read its forwarded headers."""
    request = HTTPServerRequest(start_line=RequestStartLine("GET", "/api/v1/user", "HTTP/1.1"),
                                headers=HTTPHeaders({"Host": "gpualloc", **headers}))
    request.remote_ip = peer
    ForwardedHeaders(trusted).apply(request)
    return request


@pytest.mark.parametrize("headers, address", [
    ({"X-Real-Ip": "203.0.113.7"}, "203.0.113.7"),
    ({"X-Forwarded-For": "203.0.113.7"}, "203.0.113.7"),
    ({"X-Forwarded-For": "198.51.100.1, 203.0.113.7"}, "203.0.113.7"),  # the hop our proxy saw
    ({"X-Forwarded-For": "198.51.100.1, 203.0.113.7, 127.0.0.1"}, "203.0.113.7"),  # a trusted hop is skipped
    ({"X-Forwarded-For": "127.0.0.2, ::1"}, "127.0.0.2"),  # every hop trusted: the left-most
    ({"X-Real-Ip": "2001:db8::1", "X-Forwarded-For": "203.0.113.7"}, "2001:db8::1"),
    ({"X-Real-Ip": "::ffff:203.0.113.7"}, "203.0.113.7"),
    ({"X-Real-Ip": "fe80::1%eth0"}, "fe80::1%eth0"),
])
def test_a_trusted_proxy_names_the_client(headers, address):
    assert forwarded("127.0.0.1", headers).remote_ip == address


@pytest.mark.parametrize("value", [
    "", " ", "not-an-address", "203.0.113.7:443", "203.0.113.999", "localhost", "[::1]", "1.2.3.4/8",
    "\x00", "é", "9" * 5000, "203.0.113.7, evil", "evil, " * 3000 + "evil", "," * 4000,
])
def test_hostile_values_are_ignored_without_a_crash(value):
    for name in ("X-Real-Ip", "X-Forwarded-For"):
        assert forwarded("127.0.0.1", {name: value}).remote_ip == "127.0.0.1"
    request = forwarded("127.0.0.1", {"X-Forwarded-Proto": value, "X-Scheme": value})
    assert request.protocol == "http"


def test_a_long_chain_of_trusted_hops_is_cut_short():
    chain = ", ".join(["198.51.100.9"] + ["127.0.0.1"] * 5000)
    # past MAX_HOPS hops the rest is not read: the left-most hop examined is the answer
    assert forwarded("127.0.0.1", {"X-Forwarded-For": chain}).remote_ip == "127.0.0.1"
    assert forwarded("127.0.0.1", {"X-Forwarded-For": "198.51.100.9, 127.0.0.1"}).remote_ip == "198.51.100.9"


@pytest.mark.parametrize("headers, scheme", [
    ({"X-Forwarded-Proto": "https"}, "https"),
    ({"X-Scheme": "HTTPS"}, "https"),
    ({"X-Forwarded-Proto": "http, https"}, "https"),  # the last proxy's word
    ({"X-Scheme": "http", "X-Forwarded-Proto": "https"}, "http"),
    ({"X-Forwarded-Proto": "javascript"}, "http"),
    ({"X-Forwarded-Proto": "https, gopher"}, "http"),
])
def test_a_trusted_proxy_names_the_scheme(headers, scheme):
    assert forwarded("127.0.0.1", headers).protocol == scheme


@pytest.mark.parametrize("peer, trusted", [
    ("198.51.100.4", LOOPBACK),  # a caller that is not the proxy
    ("127.0.0.1", ()),  # no proxy trusted at all
    ("10.1.2.3", ("10.0.0.0/16",)),
    ("0.0.0.0", LOOPBACK),  # tornado's address of a unix-socket caller
])
def test_an_untrusted_caller_cannot_spoof_its_address_or_scheme(peer, trusted):
    request = forwarded(peer, {"X-Real-Ip": "203.0.113.7", "X-Forwarded-For": "203.0.113.7",
                               "X-Forwarded-Proto": "https"}, trusted)
    assert (request.remote_ip, request.protocol) == (peer, "http")


def test_a_configured_proxy_network_is_trusted():
    request = forwarded("10.0.3.4", {"X-Forwarded-For": "203.0.113.7, 10.0.9.9"}, ("10.0.0.0/16",))
    assert request.remote_ip == "203.0.113.7"


def access_line(svc: ServiceProcess, headers: dict[str, str]) -> str:
    """The service's access-log line of one unauthenticated (401) call sending `headers`."""
    marker = f"user?n={time.monotonic_ns()}"
    request = urllib.request.Request(svc.url + marker, headers=headers)
    with pytest.raises(urllib.error.HTTPError) as answer:
        urllib.request.urlopen(request, timeout=10)
    assert answer.value.code == 401
    for _ in range(50):
        lines = [line for line in svc.log_tail().splitlines() if marker in line and line.startswith("401 GET")]
        if lines:
            return lines[-1]
        time.sleep(0.1)
    raise AssertionError(f"no access-log line for {marker}:\n{svc.log_tail()}")


def test_the_service_believes_only_its_trusted_proxies(fresh_service):
    behind_proxy = fresh_service().start()  # the default: loopback, where JupyterHub's proxy runs
    assert "(203.0.113.7)" in access_line(behind_proxy, {"X-Real-Ip": "203.0.113.7"})
    assert "(203.0.113.7)" in access_line(behind_proxy, {"X-Forwarded-For": "198.51.100.1, 203.0.113.7"})
    assert "(127.0.0.1)" in access_line(behind_proxy, {"X-Forwarded-For": "evil, " * 2000 + "\u00e9"})
    behind_proxy.kill()
    open_to_all = fresh_service(config='c.GpuAllocService.trusted_proxies = ["10.0.0.0/8"]\n').start()
    assert "(127.0.0.1)" in access_line(open_to_all, {"X-Real-Ip": "203.0.113.7", "X-Forwarded-Proto": "https"})


def test_a_bad_trusted_proxy_is_one_line_at_start(tmp_path):
    svc = ServiceProcess(tmp_path, config='c.GpuAllocService.trusted_proxies = ["10.0.0.0/33"]\n')
    done = subprocess.run([sys.executable, *svc.command()[1:]], capture_output=True, text=True, timeout=60,
                          cwd=tmp_path)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1].endswith(
        "trusted_proxies: '10.0.0.0/33' is not an IP address or network")
    assert "Traceback" not in done.stderr
