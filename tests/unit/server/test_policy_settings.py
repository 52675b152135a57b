"""Admission policies declare their settings and read them from one place: a policy's declared field is a
flag of `sluice serve` that builds the policy, checked where it is declared; and a policy that needs the
prompt's token count is asked by the Generate scheduler once it has tokenized, before the stream starts."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import torch

from server.admission.policies import POLICIES, PolicySettings, default_policies
from server.admission.policies.models import KnownModel
from server.admission.policies.request_bytes import RequestBytes
from server.admission.policy import AdmissionPolicy, Policies
from server.admission.policy_context import PolicyContext, Serving
from server.admission.tenants import Keys
from server.batching.continuous import ContinuousScheduler
from server.batching.requests import RequestLimits
from server.batching.worker import ModelWorker
from server.config import Settings, parser
from server.domain import GenerateSpec
from server.errors import InvalidArgument, SluiceError
from server.metrics import Metrics
from server.runtimes.byte_lm import ByteLm
from wire.sampling import Sampling


def context(keys: Keys | None = None) -> PolicyContext:
    return PolicyContext(serving=Serving(), metrics=Metrics(), keys=keys, breaker=None)


def test_a_policys_declared_setting_is_a_server_flag_that_builds_it() -> None:
    settings = Settings.from_args(["--max-request-bytes-in-flight", "7000"])
    built = default_policies(settings, context())
    [budget] = [policy for policy in built if isinstance(policy, RequestBytes)]
    assert budget.limit == 7000
    # Without keys, the policies that need them leave themselves out; the rest keep the registered order.
    assert [type(policy).__name__ for policy in built] == [
        "Lifecycle",
        "KnownModel",
        "QueueBound",
        "RequestBytes",
    ]
    assert [policy.__name__ for policy in POLICIES][:2] == ["Authentication", "Lifecycle"]


def test_a_policys_setting_is_checked_where_it_is_declared() -> None:
    with pytest.raises(ValueError, match="invalid setting max_request_bytes_in_flight: must be >= 1"):
        Settings.from_args(["--max-request-bytes-in-flight", "0"])
    with pytest.raises(ValueError, match="max_request_bytes_in_flight"):
        PolicySettings(max_request_bytes_in_flight=0)
    with pytest.raises(ValueError, match="invalid setting tenant_store: must be a redis://"):
        Settings.from_args(["--tenant-store", "localhost:6379"])
    store = "unix:///run/redis.sock"
    assert Settings.from_args(["--tenant-store", store]).tenant_store == store


def test_the_servers_own_flags_come_before_those_the_policies_declare() -> None:
    flags = re.findall(r"\n  (--[a-z-]+)", parser().format_help())
    assert flags[:2] == ["--host", "--port"]
    assert flags.index("--max-request-bytes-in-flight") > flags.index("--otlp-sampling-ratio")


def test_the_settings_stay_light_though_they_import_the_policies() -> None:
    """Front-end processes and `sluice up` load the server's Settings, and with them every policy's settings:
    neither torch nor numpy may come along (a front end grew by 11 MB when the tenants brought numpy)."""
    probe = "import sys, server.config; "
    probe += "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'numpy'}))"
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert loaded.stdout.strip() == "[]"


class PromptBound(AdmissionPolicy):
    """A policy on the prompt's token count, as --max-prompt-tokens would be."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.asked: list[tuple[str, int]] = []

    def prompt(self, model: str, spec: GenerateSpec, tokens: int) -> SluiceError | None:
        self.asked.append((model, tokens))
        if tokens > self.limit:
            return InvalidArgument(f"the prompt has {tokens} tokens; at most {self.limit}", field="text")
        return None


def test_prompt_check_is_none_unless_a_policy_counts_tokens() -> None:
    assert Policies([KnownModel()]).prompt_check is None
    bound = PromptBound(3)
    check = Policies([KnownModel(), bound]).prompt_check
    assert check is not None
    spec = GenerateSpec(model="lm", prompt_text="x", prompt_ids=None, sampling=Sampling())
    assert check("lm", spec, 3) is None
    refusal = check("lm", spec, 4)
    assert isinstance(refusal, InvalidArgument) and refusal.field == "text"
    assert bound.asked == [("lm", 3), ("lm", 4)]


def test_the_scheduler_asks_the_check_with_the_tokenized_prompt_before_it_queues() -> None:
    model = ByteLm(size="tiny", context_length=128, max_sequences=2, device=torch.device("cpu"))
    worker = ModelWorker("test")
    bound = PromptBound(5)
    try:
        worker.call(model.allocate_cache, 2 * 128)
        scheduler = ContinuousScheduler(
            model,
            worker,
            kv_tokens=2 * 128,
            prefix_cache=False,
            limits=RequestLimits(context_length=128, default_max_tokens=4),
            stream_buffer=8,
            stall_timeout_s=30.0,
            breaker=None,
            metrics=Metrics(),
            prompt_check=Policies([bound]).prompt_check,
        )
        long = GenerateSpec(model="byte-lm", prompt_text="abcdefgh", prompt_ids=None, sampling=Sampling())
        with pytest.raises(InvalidArgument, match="the prompt has 8 tokens; at most 5"):
            scheduler.submit(long)
        assert not scheduler.joining  # refused before it queued: it holds no KV memory
        short = GenerateSpec(model="byte-lm", prompt_text="abc", prompt_ids=None, sampling=Sampling())
        scheduler.submit(short)
        assert len(scheduler.joining) == 1
        assert bound.asked == [(model.descriptor.name, 8), (model.descriptor.name, 3)]
    finally:
        worker.shutdown()
