"""training/step.py: one optimizer step's forward and backward passes, the step's all-reduce, and validation,
against a direct computation on the same tiny model (one process; several are in test_train.py and test_fsdp.py)."""
import pytest
import torch
from hypothesis import given, strategies as st

from config import TrainConfig
from data.loader import validation_batches
from model import GPT, GPTConfig
from tests.helpers import synthetic_corpus
from training.distributed import Distributed
from training.errors import TrainError
from training.step import (clip_gradients, confirmation, evaluate, gather, in_lockstep, train_step,
                           votes_each_micro_batch)
from training.stopping import StopSignals

pytestmark = pytest.mark.usefixtures("one_thread", "outside_torchrun")

MODEL = dict(n_layer=1, n_head=2, n_embd=16, head_dim=8, vocab_size=320, block_size=16, pos="rope")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return synthetic_corpus(tmp_path_factory.mktemp("step_data"), 6, 300, val_tokens=2048)


def tiny(seed=0):
    torch.manual_seed(seed)
    return GPT(GPTConfig(**MODEL))


class Batches:
    """Batch number i is a fixed random (x, y); the numbers asked for are kept."""

    def __init__(self, batch_size=2):
        self.asked, self.batch_size = [], batch_size

    def batch(self, i):
        self.asked.append(i)
        generator = torch.Generator().manual_seed(i)
        x = torch.randint(0, MODEL["vocab_size"], (self.batch_size, MODEL["block_size"] + 1), generator=generator)
        return x[:, :-1], x[:, 1:]


class Processes:
    """world_size processes that all hold the same values: an all-reduce sums world_size copies."""

    def __init__(self, world_size, sharded=False):
        self.world_size, self.rank, self.sharded, self.enabled = world_size, 0, sharded, True
        self.device = torch.device("cpu")

    def all_reduce_sum(self, tensor):
        return tensor * self.world_size


def no_autocast():
    return torch.autocast("cpu", enabled=False)


def quiet_stops():
    return StopSignals(say=lambda *a: None)


# ----------------------------------------------------------------------------- a training step

@pytest.mark.parametrize("grad_accum", [1, 3])
def test_a_step_is_the_gradient_of_the_mean_loss_over_its_micro_batches(grad_accum):
    model, reference = tiny(), tiny()
    cfg = TrainConfig(grad_clip=0.0)
    ddp, batches = Distributed("cpu"), Batches()
    result = train_step(model, model, batches, 5, grad_accum, cfg, ddp, no_autocast, quiet_stops())
    assert batches.asked == [5 * grad_accum + micro for micro in range(grad_accum)]  # one process: rank 0 of 1
    losses = []
    for i in batches.asked:
        x, y = Batches().batch(i)
        losses.append(reference(x, targets=y)[1])
    mean = torch.stack(losses).mean()
    mean.backward()
    assert result.loss == pytest.approx(mean.item(), rel=1e-6)
    expected_norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in reference.parameters()]))
    assert result.grad_norm == pytest.approx(expected_norm.item(), rel=1e-5)
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-7, msg=name)
    weights = torch.linalg.vector_norm(torch.stack([p.detach().norm() for p in model.parameters()]))
    assert result.param_norm == pytest.approx(weights.item(), rel=1e-6) and not result.stop


def test_process_rank_of_world_size_reads_its_own_batches_of_each_step():
    ddp, batches = Distributed("cpu"), Batches()
    ddp.rank, ddp.world_size = 1, 3  # (no group: every collective a no-op; only the numbers read are checked)
    train_step(tiny(), tiny(), batches, 4, 2, TrainConfig(), ddp, no_autocast, quiet_stops())
    assert batches.asked == [(4 * 2 + micro) * 3 + 1 for micro in range(2)] == [25, 28]
    confirmation(tiny(), batches, 4, 2, ddp, no_autocast, quiet_stops())
    assert batches.asked[-1] == 4 * 2 * 3 + 1


def test_loss_scale_scales_the_gradients_and_not_the_reported_loss():
    plain, scaled = tiny(), tiny()
    ddp = Distributed("cpu")
    official = TrainConfig(grad_clip=0.0, grad_scale="official", reference_layout="2x4", global_batch_size=8)
    assert official.loss_scale == 4  # the authors' micro-batches per process
    one = train_step(plain, plain, Batches(), 0, 2, TrainConfig(grad_clip=0.0), ddp, no_autocast, quiet_stops())
    four = train_step(scaled, scaled, Batches(), 0, 2, official, ddp, no_autocast,
                      quiet_stops())
    assert four.loss == pytest.approx(one.loss, rel=1e-6)
    for p, q in zip(plain.parameters(), scaled.parameters()):
        torch.testing.assert_close(q.grad, 4 * p.grad, rtol=1e-5, atol=1e-7)


def test_a_stop_request_between_micro_batches_drops_the_step_and_its_gradients():
    model = tiny()
    stops = quiet_stops()

    class StopDuringTheFirst(Batches):
        def batch(self, i):
            stops.requested = True  # the request arrives while micro-batch 0 runs
            return super().batch(i)

    batches = StopDuringTheFirst()
    assert train_step(model, model, batches, 0, 4, TrainConfig(), Distributed("cpu"), no_autocast, stops) is None
    assert batches.asked == [0]
    assert all(p.grad is None for p in model.parameters())
    # one long accumulation on one process votes between micro-batches; several processes only from 8 on
    assert votes_each_micro_batch(2, Distributed("cpu")) and not votes_each_micro_batch(1, Distributed("cpu"))
    assert not votes_each_micro_batch(7, Processes(2)) and votes_each_micro_batch(8, Processes(2))


def test_gradients_are_clipped_to_the_norm_and_the_norm_before_clipping_is_returned():
    a, b = torch.zeros(3, requires_grad=True), torch.zeros(2, requires_grad=True)
    a.grad, b.grad = torch.tensor([3.0, 0.0, 4.0]), torch.tensor([0.0, 12.0])
    assert clip_gradients([a, b], 6.5, sharded=False).item() == pytest.approx(13.0)
    torch.testing.assert_close(a.grad, torch.tensor([1.5, 0.0, 2.0]))
    torch.testing.assert_close(b.grad, torch.tensor([0.0, 6.0]))
    a.grad, b.grad = torch.tensor([3.0, 0.0, 4.0]), torch.tensor([0.0, 12.0])
    assert clip_gradients([a, b], 0.0, sharded=False).item() == pytest.approx(13.0)  # 0: no clipping
    torch.testing.assert_close(b.grad, torch.tensor([0.0, 12.0]))


def test_gather_averages_the_loss_and_overflow_over_the_processes_and_counts_any_stop():
    model = tiny()
    stops = quiet_stops()
    weights = torch.linalg.vector_norm(torch.stack([p.norm() for p in model.parameters()])).item()
    result = gather(torch.tensor(2.5), model, Processes(3), stops, grad_norm=torch.tensor(0.75))
    assert (result.loss, result.grad_norm, result.stop) == (pytest.approx(2.5), 0.75, False)
    assert result.param_norm == pytest.approx(weights, rel=1e-6)  # a replica each: the mean of equal norms
    assert result.overflow == pytest.approx(model.basis_overflow().item())
    stops.requested = True
    assert gather(torch.tensor(2.5), model, Processes(3), stops).stop
    # under FSDP each process holds a shard: the squares are summed over the processes
    sharded = gather(torch.tensor(2.5), model, Processes(4, sharded=True), quiet_stops())
    assert sharded.param_norm == pytest.approx(weights * 2, rel=1e-6) and sharded.grad_norm is None


def test_the_check_before_saving_scores_the_next_steps_first_micro_batch():
    model = tiny()
    batches = Batches()
    result = confirmation(model, batches, 7, 3, Distributed("cpu"), no_autocast, quiet_stops())
    assert batches.asked == [21]
    x, y = Batches().batch(21)
    assert result.loss == pytest.approx(model(x, targets=y)[1].item(), rel=1e-6) and result.grad_norm is None


# ----------------------------------------------------------------------------- validation

def direct_validation_loss(model, data_dir, windows):
    """The mean loss over the first `windows` validation windows, one window at a time."""
    losses = [model(x, targets=y)[1] for x, y in validation_batches(data_dir, 1, MODEL["block_size"], windows)]
    return torch.stack(losses).mean().item()


@pytest.mark.parametrize("batch_size", [1, 3, 4])
def test_validation_is_the_mean_over_the_windows_whatever_the_batch_size(data_dir, batch_size):
    model = tiny()
    cfg = TrainConfig(batch_size=batch_size, eval_windows=10)  # 10: the last batch of 3 or 4 is smaller
    with torch.no_grad():
        expected = direct_validation_loss(model, data_dir, 10)
    loss = evaluate(model, data_dir, cfg, MODEL["block_size"], Distributed("cpu"), no_autocast)
    assert loss == pytest.approx(expected, rel=1e-6)
    assert model.training  # back in training mode


def test_validation_stops_when_asked_and_refuses_a_split_without_windows(data_dir):
    model = tiny()
    stops = quiet_stops()
    stops.requested = True
    assert evaluate(model, data_dir, TrainConfig(batch_size=2, eval_windows=8), MODEL["block_size"],
                    Distributed("cpu"), no_autocast, stops) is None
    with pytest.raises(TrainError, match="has no validation windows of length 16"):
        evaluate(model, data_dir, TrainConfig(batch_size=2, eval_windows=0), MODEL["block_size"], Distributed("cpu"),
                 no_autocast)


def test_validation_says_how_far_it_is_when_it_takes_long(data_dir, monkeypatch):
    import training.step as step
    notes = []
    ddp = Distributed("cpu")
    monkeypatch.setattr(ddp, "say", notes.append)
    monkeypatch.setattr(step, "PROGRESS_EVERY_S", -1.0)  # every batch after the first
    evaluate(tiny(), data_dir, TrainConfig(batch_size=2, eval_windows=6), MODEL["block_size"], ddp, no_autocast)
    assert [note.split(",")[0] for note in notes] == ["validation: 2/6 windows", "validation: 4/6 windows"]
    assert all(note.endswith("left") for note in notes)


@given(st.integers(0, 9), st.integers(1, 4))
def test_lockstep_pads_to_whole_rounds_with_uncounted_repeats(n, world_size):
    batches = [(torch.tensor([i]), torch.tensor([-i])) for i in range(n)]
    padded = in_lockstep(batches, world_size)
    assert len(padded) % world_size == 0 and len(padded) - n < world_size
    assert [(x.item(), y.item(), counted) for x, y, counted in padded[:n]] == [(i, -i, True) for i in range(n)]
    last_round = n // world_size * world_size
    for x, _, counted in padded[n:]:
        assert not counted and x.item() == last_round
