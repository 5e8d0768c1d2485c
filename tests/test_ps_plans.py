"""Tier 1 (no processes): sharding plans on VGG-16's real shapes, the consistency models' rules,
the server's push/pull logic over a fake communicator, and the ps option checks."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from polytrain.config import make_config
from polytrain.data import dataset_spec
from polytrain.errors import ConfigError
from polytrain.models import resolve_model
from polytrain.runtime.sharding import ParamInfo, layer_plan, make_plan, param_infos, size_plan
from polytrain.strategies import make_strategy
from polytrain.strategies.ps.client import PSClient
from polytrain.strategies.ps.consistency import Async, Bsp, KOfN, ProtocolError, Ssp, make_consistency
from polytrain.strategies.ps.server import DONE, PULL, PUSH, ParameterServer, make_server_optimizer


@pytest.fixture(scope="module")
def vgg16_params() -> list[ParamInfo]:
    """VGG-16 at full width on 224×224 images, built on the meta device (nothing allocated)."""
    spec = dataset_spec("synthetic-images", {"size": 224})
    with torch.device("meta"):
        model = resolve_model("vgg16", spec, {"width": 64})
    return param_infos(model)


def test_vgg16_shapes_are_vgg16(vgg16_params: list[ParamInfo]) -> None:
    total = sum(p.numel for p in vgg16_params)
    fc1 = sum(p.numel for p in vgg16_params if p.layer == "fc1")
    assert len({p.layer for p in vgg16_params}) == 16
    assert 100e6 < total < 160e6 and 0.70 < fc1 / total < 0.80  # VGG-16: 138 M, fc1 ~74 %


@pytest.mark.parametrize("servers", [1, 2, 3, 4, 8])
def test_size_plan_balances_within_one_element(vgg16_params: list[ParamInfo], servers: int) -> None:
    plan = size_plan(vgg16_params, servers)
    plan.check()
    sizes = plan.sizes()
    assert sum(sizes) == plan.total and max(sizes) - min(sizes) <= 1
    assert all(len(plan.ranges(s)) == 1 for s in range(servers))  # one contiguous range each


@pytest.mark.parametrize("servers", [2, 4, 8])
def test_layer_plan_keeps_layers_whole(vgg16_params: list[ParamInfo], servers: int) -> None:
    plan = layer_plan(vgg16_params, servers)
    plan.check()
    owner: dict[str, int] = {}
    numel = {p.name: p.numel for p in vgg16_params}
    for s, shard in enumerate(plan.shards):
        for piece in shard:
            assert (piece.start, piece.stop) == (0, numel[piece.name])  # whole tensors
            assert owner.setdefault(piece.name.split(".")[0], s) == s  # whole layers
    # fc1 alone holds ~3/4: its server is the bottleneck however many servers there are
    assert max(plan.sizes()) / plan.total > 0.7
    assert min(plan.sizes()) > 0


def test_plans_print_and_round_trip() -> None:
    params = [ParamInfo("a.weight", (4, 3)), ParamInfo("a.bias", (4,)), ParamInfo("b.weight", (2, 4))]
    flat = torch.arange(24, dtype=torch.float32)
    for plan in (layer_plan(params, 2), size_plan(params, 3)):
        plan.check()
        out = torch.zeros(24)
        for s in range(plan.servers):
            plan.scatter(out, s, plan.gather(flat, s))
        assert torch.equal(out, flat)
        text = str(plan)
        assert f"{plan.kind} plan: 24 parameters on {plan.servers} servers" in text
    assert str(size_plan(params, 3)).splitlines()[2:] == [
        "0            8  33.3%  a.weight[0:8]",
        "1            8  33.3%  a.weight[8:12] a.bias[0:4]",
        "2            8  33.3%  b.weight[0:8]",
    ]
    assert layer_plan(params, 2).sizes() == [16, 8]


def test_empty_server_is_refused() -> None:
    params = [ParamInfo("a.weight", (4, 3)), ParamInfo("b.weight", (2, 4))]
    with pytest.raises(ConfigError, match=r"leaves server\(s\) \[2\] without parameters.*servers=2"):
        make_plan("layer", params, 3)


# ------------------------------------------------------------------------------- consistency


def test_bsp_applies_the_mean_once_all_pushed() -> None:
    bsp = Bsp(3)
    assert bsp.on_push(0, 1, torch.tensor([3.0])) is None
    assert bsp.on_push(2, 1, torch.tensor([6.0])) is None
    out = bsp.on_push(1, 1, torch.tensor([0.0]))
    assert out is not None and out.item() == 3.0 and bsp.step == 1 and bsp.need(1) == 1
    with pytest.raises(ProtocolError, match="pushed step 3"):
        bsp.on_push(0, 3, torch.tensor([1.0]))


def test_k_of_n_drops_the_late() -> None:
    kn = KOfN(3, k=2)
    assert kn.on_push(0, 1, torch.tensor([1.0])) is None
    out = kn.on_push(1, 1, torch.tensor([3.0]))
    assert out is not None and out.item() == 2.0 and kn.step == 1
    assert kn.on_push(2, 1, torch.tensor([100.0])) is None  # step 1 is done: dropped
    assert kn.dropped == 1 and kn.accepted == [1, 1, 0]


def test_async_and_ssp_apply_each_push_scaled() -> None:
    a = Async(4)
    out = a.on_push(1, 1, torch.tensor([8.0]))
    assert out is not None and out.item() == 2.0 and a.need(1) == -1 and a.step == 0
    s = Ssp(2, staleness=3)
    s.on_push(0, 1, torch.tensor([1.0]))
    s.on_push(0, 2, torch.tensor([1.0]))
    assert s.step == 0 and s.need(5) == 2
    s.on_push(1, 1, torch.tensor([1.0]))
    assert s.step == 1
    assert make_consistency("ssp", 2, staleness=0).need(4) == make_consistency("bsp", 2).need(4)


# ------------------------------------------------------------------- server logic, fake comm


class _Work:
    def is_completed(self) -> bool:
        return True

    def wait(self) -> None:
        pass


class FakeComm:
    """Records isends; recv hands out queued payloads."""

    rank, bytes_sent, bytes_received = 0, 0, 0

    def __init__(self) -> None:
        self.sent: list[tuple[int, str, torch.Tensor]] = []
        self.queue: list[torch.Tensor] = []

    def isend(self, t: torch.Tensor, dst: int, op: str = "") -> _Work:
        self.sent.append((dst, op, t.clone()))
        return _Work()

    def recv(self, t: torch.Tensor, src: Any = None, op: str = "") -> int:
        t.copy_(self.queue.pop(0))
        return int(src or 0)

    def replies(self) -> list[tuple[int, list[int]]]:
        out = [(dst, t.tolist()) for dst, op, t in self.sent if op == "ps_header"]
        self.sent.clear()
        return out


def _server(policy: Any, opt: str = "sgd") -> tuple[ParameterServer, FakeComm]:
    comm = FakeComm()
    server = ParameterServer(comm, [1, 2], torch.zeros(2), opt, policy, lr=0.5)  # type: ignore[arg-type]
    return server, comm


def _push(server: ParameterServer, comm: FakeComm, src: int, clock: int, grad: list[float],
          need: int | None) -> None:
    comm.queue.append(torch.tensor(grad))
    server._handle(src, PUSH, clock, need or 0, int(need is not None))


def test_bsp_server_answers_pulls_after_the_step() -> None:
    server, comm = _server(Bsp(2))
    _push(server, comm, 1, 1, [1.0, 2.0], need=1)
    assert comm.replies() == []  # waits for worker 2
    _push(server, comm, 2, 1, [3.0, 4.0], need=1)
    assert torch.allclose(server.shard, torch.tensor([-1.0, -1.5]))  # 0 - 0.5 * mean
    assert comm.replies() == [(1, [1, 1, 0, 0, 0]), (2, [1, 1, 0, 0, 0])]
    assert server.staleness == {0: 2}


def test_ssp_server_holds_a_fast_worker_at_the_bound() -> None:
    server, comm = _server(Ssp(2, staleness=1))
    _push(server, comm, 1, 1, [1.0, 1.0], need=0)  # clock 1, may start step 2: 0 >= 1 - 1
    assert [d for d, _ in comm.replies()] == [1]
    _push(server, comm, 1, 2, [1.0, 1.0], need=1)  # clock 2 needs the slowest at 1
    assert comm.replies() == []
    _push(server, comm, 2, 1, [1.0, 1.0], need=0)  # the slow one reaches clock 1
    assert sorted(d for d, _ in comm.replies()) == [1, 2]
    assert server.staleness == {0: 2, 1: 1} and max(server.staleness) <= 1
    assert server.version == 3


def test_k_of_n_server_counts_drops_and_never_waits() -> None:
    server, comm = _server(KOfN(2, k=1))
    _push(server, comm, 1, 1, [2.0, 2.0], need=1)
    assert comm.replies() == [(1, [1, 1, 0, 0, 0])]
    _push(server, comm, 2, 1, [100.0, 100.0], need=1)  # late: dropped, answered at once
    assert comm.replies() == [(2, [1, 1, 0, 0, 0])]
    assert server.policy.dropped == 1 and torch.allclose(server.shard, torch.tensor([-1.0, -1.0]))


def test_server_pull_and_done() -> None:
    server, comm = _server(Async(2))
    server._handle(1, PULL, 0, -1, 1)
    assert comm.replies() == [(1, [0, 0, 0, 0, 0])]
    server._handle(1, DONE, 0, 0, 0)
    server._handle(2, DONE, 0, 0, 0)
    assert server.done == {1, 2}
    with pytest.raises(ProtocolError, match="not a client"):
        server._handle(7, PULL, 0, 0, 1)


def test_server_busy_time_is_the_union_of_its_intervals() -> None:
    server, _ = _server(Async(2))
    for a, b in [(1.0, 2.0), (0.5, 1.5), (1.2, 1.4), (3.0, 3.5)]:  # overlapping receives
        server.intervals.add(a, b)
    assert server.busy_s() == pytest.approx(2.0)


def test_server_busy_clock_stays_bounded_and_exact_over_a_long_run() -> None:
    from polytrain.strategies.ps.busy import COMPACT_AT, BusyClock

    clock = BusyClock()
    for i in range(10 * COMPACT_AT):  # two overlapping intervals per unit, then a gap of 0.5
        clock.add(i + 0.0, i + 0.4)
        clock.add(i + 0.2, i + 0.5)
    assert len(clock) < COMPACT_AT
    assert clock.seconds() == pytest.approx(10 * COMPACT_AT * 0.5)


def test_sparse_pushes_are_lossless() -> None:
    server, comm = _server(Async(2))
    comm.queue += [torch.tensor([1], dtype=torch.int32), torch.tensor([4.0])]
    server._handle(1, PUSH, 1, -1, 0, 1)  # one non-zero: index 1, value 4
    assert torch.allclose(server.shard, torch.tensor([0.0, -1.0]))  # 0 - 0.5 * 4 / W
    server._handle(2, PUSH, 1, -1, 0, 0)  # an all-zero gradient carries no payload
    assert server.version == 2 and torch.allclose(server.shard, torch.tensor([0.0, -1.0]))
    plan = size_plan([ParamInfo("a.weight", (8,))], 1)
    client = PSClient(comm, plan, [0])  # type: ignore[arg-type]
    client.push(torch.tensor([0.0, 0, 0, 5, 0, 0, 0, 0]), clock=3)
    (_, _, head), (_, _, idx), (_, _, vals) = comm.sent
    assert head.tolist() == [PUSH, 3, 0, 0, 1] and idx.tolist() == [3] and vals.tolist() == [5.0]
    comm.sent.clear()
    client.push(torch.ones(8), clock=4)  # dense: the shard as it is
    assert [t.numel() for _, _, t in comm.sent] == [5, 8] and client.sparse_pushes == 1


@pytest.mark.parametrize("name,cls,kw", [("momentum", torch.optim.SGD, {"momentum": 0.9}),
                                         ("adagrad", torch.optim.Adagrad, {}),
                                         ("adam", torch.optim.Adam, {})])
def test_server_optimizers_apply_shard_by_shard(name: str, cls: Any, kw: dict[str, Any]) -> None:
    """Element-wise optimizers: two shards updated apart equal the whole vector updated at once."""
    torch.manual_seed(0)
    whole = torch.nn.Parameter(torch.randn(10))
    ref = cls([whole], lr=0.1, **kw)
    halves = [torch.nn.Parameter(whole.detach()[:4].clone()), torch.nn.Parameter(whole.detach()[4:].clone())]
    opts = [make_server_optimizer(name, h, lr=0.1) for h in halves]
    for _ in range(3):
        g = torch.randn(10)
        whole.grad = g
        ref.step()
        for h, o, part in zip(halves, opts, (g[:4], g[4:]), strict=True):
            h.grad = part.clone()
            o.step()
    torch.testing.assert_close(torch.cat([h.detach() for h in halves]), whole.detach())


# -------------------------------------------------------------------------------- options


def _check(options: dict[str, Any], procs: int = 4, **job: Any) -> None:
    cfg = make_config({"strategy": "ps", "procs": procs, "model": "mlp", "batch_size": 24,
                       "options": options, **job})
    make_strategy("ps", options).check(cfg, procs)


@pytest.mark.parametrize("options,procs,job,match", [
    ({"servers": 4}, 4, {}, r"needs at least one worker.*--procs 5"),
    ({"servers": 1}, 6, {}, r"multiple of 5"),
    ({"staleness": 2}, 4, {}, r"staleness=2 applies to consistency=ssp"),
    ({"consistency": "k-of-n", "k": 5}, 4, {}, r"k=5 needs .* 1 <= k <= workers \(3 here"),
    ({"n_push": 2}, 4, {}, r"n_push=2/n_fetch=1 apply to consistency=async"),
    ({"servers": 2, "sharding": "layer", "consistency": "bsp"}, 6,
     {"model_options": {"depth": 0}}, r"servers=1 or --set sharding=size"),
])
def test_ps_refuses_impossible_jobs(options: dict[str, Any], procs: int, job: dict[str, Any],
                                    match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        _check(options, procs, **job)


def test_ps_k_of_n_checkpoint_is_refused_before_launch() -> None:
    from polytrain.launch.prepare import prepare

    cfg = make_config({"strategy": "ps", "procs": 4, "model": "mlp", "batch_size": 24,
                       "checkpoint_every": 5, "options": {"consistency": "k-of-n"}})
    with pytest.raises(ConfigError, match=r"'ps' does not support checkpoint.*k-of-n"):
        prepare(cfg)
    prepare(cfg.model_copy(update={"options": {}}))  # bsp checkpoints


def test_ps_roles_and_valid_options() -> None:
    _check({"servers": 1, "consistency": "ssp", "staleness": 0})
    _check({"consistency": "async", "n_push": 3, "n_fetch": 2})
    assert make_strategy("ps", {"servers": 2}).roles(5) == ["server"] * 2 + ["worker"] * 3
    with pytest.raises(ConfigError, match="consistency"):
        make_strategy("ps", {"consistency": "eventual"})


@pytest.mark.parametrize("strategy,procs,options", [
    ("ps", 3, {}), ("sandblaster", 4, {"batch": "job"}), ("distbelief", 4, {})])
def test_parameter_servers_refuse_buffers_before_launch(strategy: str, procs: int,
                                                        options: dict[str, Any]) -> None:
    """Servers hold parameters only: BatchNorm's running statistics would never reach the model
    they evaluate and save, so a model with buffers is refused before any process starts."""
    from polytrain.launch.prepare import prepare

    bn = make_config({"strategy": strategy, "procs": procs, "model": "vgg16", "dataset": "synthetic-images",
                      "batch_size": 24, "model_options": {"width": 2, "batch_norm": True},
                      "options": options})
    with pytest.raises(ConfigError, match=r"not its buffers.*conv1_1\.1\.running_mean.*GroupNorm"):
        prepare(bn)
    prepare(bn.model_copy(update={"model_options": {"width": 2}}))  # the same model without BatchNorm
