"""Model switching on one server (app/server/pool.py) with fake models whose plans hold host RAM: a request naming
another local model loads it, planned for the start-up report less what the loaded models' plans hold; the least
recently used idle model makes room, never one with a request in flight; --max-loaded-models; a model too large
even alone is a 507 while the others keep serving; concurrent requests share one load; keep_alive 0 unloads;
/api/ps, /v1/models and /metrics say what is loaded."""

from __future__ import annotations

import dataclasses
import threading

import httpx
import pytest

from app.server import pool as pool_module
from app.server.ollama_models import CatalogEntry
from app.server.pool import Opened
from backends.errors import ModelFormatError
from hwprobe.errors import PlanError
from hwprobe.plan_types import DeviceMemory, Plan
from hwprobe.report import HardwareReport, load_report
from tests.fakes import FakeBackend, fake_spec

pytestmark = pytest.mark.server

FIXTURE = "tests/hwprobe/fixtures/no_gpu_laptop.json"
RAM_MIB = 10_000  # what the start-up report says is available
NEED = {"alpha": 4_000, "beta": 4_000, "gamma": 5_000, "huge": 20_000}  # each model's plan, in MiB of host RAM


def plan_for(name: str, report: HardwareReport) -> Plan:
    """A llama.cpp-on-the-CPU plan holding NEED[name] MiB, or a PlanError when the report has less available."""
    need = NEED[name]
    if report.ram_available_mib < need:
        raise PlanError(f"{name} needs {need} MiB of RAM and {report.ram_available_mib} MiB are available")
    host = DeviceMemory("cpu", None, "cpu", need, 0, 0, 0, report.ram_available_mib)
    return Plan("llama.cpp", "Q4_0", 0, 2, "none", (), 2048, "f16", False, 512, (host,), 10.0, ())


class FakeOpener:
    """The pool's Opener over fake models: what each load was planned for, and a load that can be made slow."""

    def __init__(self) -> None:
        self.loads: list[tuple[str, int]] = []  # (name, RAM available in the report it was planned for)
        self.backends: dict[str, FakeBackend] = {}
        self.load_delay_s = 0.0
        self.token_delay_s = 0.0

    def plan(self, name: str, report: HardwareReport) -> Plan:
        return plan_for(name, report)

    def __call__(self, name: str, report: HardwareReport) -> Opened:
        plan = plan_for(name, report)
        self.loads.append((name, report.ram_available_mib))
        backend = FakeBackend(
            spec=fake_spec(name=name),
            replies=[f"{name} answers."],
            load_delay_s=self.load_delay_s,
            token_delay_s=self.token_delay_s,
        )
        backend.load()
        self.backends[name] = backend
        return Opened(backend, name, plan)


def catalog() -> list[CatalogEntry]:
    return [CatalogEntry(name, fake_spec(name=name), 1 << 20, 0.0) for name in NEED]


@pytest.fixture
def serve(live):  # type: ignore[no-untyped-def]
    def start(**config):  # type: ignore[no-untyped-def]
        report = dataclasses.replace(load_report(FIXTURE), ram_available_mib=RAM_MIB)
        opener = FakeOpener()
        first = FakeBackend(spec=fake_spec(name="alpha"), replies=["alpha answers."])
        first.load()
        opener.backends["alpha"] = first
        s = live(
            first,
            model_name="alpha",
            opener=opener,
            report=report,
            first_plan=plan_for("alpha", report),
            catalog=catalog,
            **config,
        )
        return s, opener

    return start


def chat(url: str, model: str, **extra) -> httpx.Response:  # type: ignore[no-untyped-def]
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": False, **extra}
    return httpx.post(url + "/api/chat", json=body, timeout=60)


def loaded(url: str) -> list[str]:
    return [m["name"] for m in httpx.get(url + "/api/ps", timeout=10).json()["models"]]


def test_another_model_loads_beside_the_first_planned_for_what_is_left(serve) -> None:  # type: ignore[no-untyped-def]
    s, opener = serve()
    r = chat(s.url, "beta")
    assert r.status_code == 200 and r.json()["message"]["content"] == "beta answers."
    assert r.json()["load_duration"] > 0 and r.json()["model"] == "beta"
    assert opener.loads == [("beta", RAM_MIB - NEED["alpha"])]  # alpha's plan counted as taken
    assert sorted(loaded(s.url)) == ["alpha", "beta"]
    assert chat(s.url, "alpha").json()["message"]["content"] == "alpha answers."  # still loaded: no reload
    assert chat(s.url, "beta:latest").json()["load_duration"] == 0 and len(opener.loads) == 1
    openai = httpx.post(
        s.url + "/v1/chat/completions", json={"model": "beta", "messages": [{"role": "user", "content": "hi"}]}
    ).json()
    assert openai["model"] == "beta" and openai["choices"][0]["message"]["content"] == "beta answers."
    models = [m["id"] for m in httpx.get(s.url + "/v1/models").json()["data"]]
    assert models == ["alpha", "beta", "gamma", "huge"]
    metrics = httpx.get(s.url + "/metrics").text
    assert "hearth_models_loaded 2.0" in metrics and 'hearth_model_loaded{model="beta"} 1.0' in metrics
    assert httpx.get(s.url + "/health").json() == {"status": "ok", "model": "alpha", "loaded": ["beta", "alpha"]}


def test_the_least_recently_used_idle_model_makes_room(serve) -> None:  # type: ignore[no-untyped-def]
    s, opener = serve()
    chat(s.url, "beta")  # alpha 4000 + beta 4000 of 10000
    chat(s.url, "alpha")  # alpha is now the most recently used
    r = chat(s.url, "gamma")  # 5000 more does not fit beside both: beta (least recent) goes
    assert r.status_code == 200 and r.json()["message"]["content"] == "gamma answers."
    assert sorted(loaded(s.url)) == ["alpha", "gamma"] and opener.backends["beta"].closed
    assert opener.loads[-1] == ("gamma", RAM_MIB - NEED["alpha"])  # planned once beta's memory was free
    assert not opener.backends["alpha"].closed


def test_a_model_with_a_request_in_flight_is_never_unloaded(serve, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(pool_module, "WAIT_FOR_IDLE_S", 1.0)
    s, opener = serve(max_loaded_models=1)
    opener.backends["alpha"].token_delay_s = 0.5  # alpha's reply takes ~3 s
    opener.backends["alpha"].replies = ["one two three four five six"]
    slow = threading.Thread(target=chat, args=(s.url, "alpha"))
    slow.start()
    try:
        pool = s.app.state.pool
        deadline = 50
        while pool.in_flight() == 0 and deadline:
            threading.Event().wait(0.05)
            deadline -= 1
        r = chat(s.url, "beta")  # the only slot is alpha's, busy past the 1 s wait
        assert r.status_code == 503 and "retry" in r.json()["error"]
        assert not opener.backends["alpha"].closed
    finally:
        slow.join(30)
    opener.backends["alpha"].token_delay_s = 0.0
    assert chat(s.url, "beta").status_code == 200  # idle now: alpha makes room
    assert loaded(s.url) == ["beta"] and opener.backends["alpha"].closed


def test_max_loaded_models_unloads_before_the_next_loads(serve) -> None:  # type: ignore[no-untyped-def]
    s, opener = serve(max_loaded_models=1)
    assert chat(s.url, "beta").status_code == 200
    assert loaded(s.url) == ["beta"] and opener.backends["alpha"].closed
    assert opener.loads == [("beta", RAM_MIB)]  # nothing else held memory when it was planned
    assert chat(s.url, "alpha").json()["message"]["content"] == "alpha answers."  # loads again, on demand
    assert loaded(s.url) == ["alpha"]


def test_a_model_too_large_even_alone_is_a_507_and_the_others_keep_serving(serve) -> None:  # type: ignore[no-untyped-def]
    s, opener = serve(max_loaded_models=1)  # the cap would unload alpha for a model that could load
    r = chat(s.url, "huge")
    assert r.status_code == 507 and "cannot be loaded on this machine even alone" in r.json()["error"]
    assert "huge needs 20000 MiB" in r.json()["error"]
    r = httpx.post(
        s.url + "/v1/chat/completions", json={"model": "huge", "messages": [{"role": "user", "content": "x"}]}
    )
    assert r.status_code == 507 and r.json()["error"]["code"] == "model_too_large"
    assert loaded(s.url) == ["alpha"] and not opener.backends["alpha"].closed
    assert chat(s.url, "alpha").status_code == 200
    r = chat(s.url, "nope")
    assert r.status_code == 404 and "not found" in r.json()["error"]


def test_requests_for_a_loading_model_wait_for_the_one_load(serve) -> None:  # type: ignore[no-untyped-def]
    s, opener = serve()
    opener.load_delay_s = 1.0
    results: list[httpx.Response] = []
    threads = [threading.Thread(target=lambda: results.append(chat(s.url, "beta"))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert [r.status_code for r in results] == [200] * 4
    assert [name for name, _ in opener.loads] == ["beta"]  # one load, four answers


def test_keep_alive_zero_unloads_and_the_next_request_plans_again(serve) -> None:  # type: ignore[no-untyped-def]
    s, opener = serve()
    chat(s.url, "beta")
    r = httpx.post(s.url + "/api/generate", json={"model": "beta", "keep_alive": 0}, timeout=30)
    assert r.status_code == 200 and r.json()["done_reason"] == "unload"
    assert loaded(s.url) == ["alpha"] and opener.backends["beta"].closed
    assert chat(s.url, "beta").status_code == 200 and len(opener.loads) == 2
    r = httpx.post(s.url + "/api/chat", json={"model": "gamma", "stream": False}, timeout=30)  # empty: loads it
    assert r.json()["done_reason"] == "load" and "gamma" in loaded(s.url)


def test_without_an_opener_another_model_is_a_404_naming_the_served_one(live) -> None:  # type: ignore[no-untyped-def]
    backend = FakeBackend(spec=fake_spec(name="alpha"))
    backend.load()
    s = live(backend, model_name="alpha", catalog=catalog)
    r = chat(s.url, "beta")
    assert r.status_code == 404 and "hearth serve --model beta" in r.json()["error"]
    assert [m["id"] for m in httpx.get(s.url + "/v1/models").json()["data"]] == ["alpha"]


def test_a_model_that_fails_to_load_is_that_requests_error_and_the_server_goes_on(serve) -> None:  # type: ignore[no-untyped-def]
    s, opener = serve(max_loaded_models=1)
    real = opener.__call__

    def broken(name, report):  # type: ignore[no-untyped-def]
        if name == "beta":
            raise ModelFormatError("beta.gguf is truncated: 10 of 4000 MiB", "download it again")
        return real(name, report)

    opener.__class__ = type("BrokenOpener", (FakeOpener,), {"__call__": lambda self, n, r: broken(n, r)})
    r = chat(s.url, "beta")
    assert r.status_code == 500 and r.json()["error"].startswith("cannot load 'beta': beta.gguf is truncated")
    assert loaded(s.url) == []  # alpha made room for a load that failed
    assert httpx.get(s.url + "/metrics").status_code == 200 and httpx.get(s.url + "/health").status_code == 200
    assert chat(s.url, "alpha").json()["message"]["content"] == "alpha answers."  # back on demand
