"""train.py's init_from: a Qwen3 checkpoint written by transformers starts a run of ours, which continues
and resumes; what our model cannot express is refused in one sentence."""
import re
import shutil

import pytest
import torch
import torch.nn.functional as F

import train
from config import ConfigError
from data.loader import validation_batches
from tests.helpers import TINY_MODEL, synthetic_corpus, tiny_config

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return synthetic_corpus(tmp_path_factory.mktemp("init_data"), 20, 500)


def qwen3(directory, **overrides):
    """A Qwen3ForCausalLM of the tiny model's shape, made and saved by transformers, norm gains off init."""
    values = dict(vocab_size=TINY_MODEL["vocab_size"], hidden_size=TINY_MODEL["n_embd"], intermediate_size=85,
                  num_hidden_layers=TINY_MODEL["n_layer"], num_attention_heads=TINY_MODEL["n_head"],
                  num_key_value_heads=TINY_MODEL["n_head"], head_dim=TINY_MODEL["head_dim"], rms_norm_eps=1e-5,
                  tie_word_embeddings=True, max_position_embeddings=64,
                  rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    torch.manual_seed(0)
    model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**{**values, **overrides})).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.2 * torch.randn_like(p))
    model.save_pretrained(directory)
    return model


def test_a_qwen3_checkpoint_starts_a_run_that_continues_and_resumes(tmp_path, data_dir):
    model = qwen3(tmp_path / "qwen3")
    config = tmp_path / "tiny.toml"
    config.write_text(tiny_config(data_dir, model={"pos": "rope"}, max_iters=4, warmup_iters=1, eval_interval=2,
                                  eval_windows=8, init_from=str(tmp_path / "qwen3")))
    straight = train.run([str(config), f"--out_dir={tmp_path / 'a'}"])
    # iteration 0's validation loss is transformers' Qwen3 on the same windows: the run started from its weights
    total, count = 0.0, 0
    with torch.no_grad():
        for x, y in validation_batches(data_dir, batch_size=4, block_size=TINY_MODEL["block_size"], max_windows=8):
            logits = model(x).logits
            total += F.cross_entropy(logits.flatten(0, 1), y.flatten()).item() * len(x)
            count += len(x)
    assert straight["val_losses"][0][0] == 0
    assert straight["val_losses"][0][1] == pytest.approx(total / count, rel=1e-5)
    assert straight["losses"][-1] < straight["losses"][0]
    # a resumed run continues from its own checkpoint: init_from is not read again (here it is gone)
    first = train.run([str(config), f"--out_dir={tmp_path / 'b'}", "--stop_iter=2"])
    shutil.rmtree(tmp_path / "qwen3")
    second = train.run([str(config), f"--out_dir={tmp_path / 'b'}", "--resume"])
    assert first["losses"] + second["losses"] == straight["losses"]


@pytest.mark.parametrize("overrides,message", [
    ({"num_key_value_heads": 1}, "n_kv_head=1"),  # a grouped Qwen3 is another model than this run's
    ({"tie_word_embeddings": False}, "not tied"),
    ({"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}}, "'linear' scaled"),
])
def test_a_qwen3_our_model_cannot_express_is_one_sentence(tmp_path, data_dir, overrides, message):
    qwen3(tmp_path / "qwen3", **overrides)
    config = tmp_path / "tiny.toml"
    config.write_text(tiny_config(data_dir, model={"pos": "rope"}, init_from=str(tmp_path / "qwen3")))
    with pytest.raises(ConfigError, match=message) as error:
        train.run([str(config), f"--out_dir={tmp_path / 'run'}"])
    assert "\n" not in str(error.value)
    assert not (tmp_path / "run").exists()


def test_init_from_names_the_settings_to_change(tmp_path, data_dir):
    qwen3(tmp_path / "qwen3", num_hidden_layers=3)
    config = tmp_path / "tiny.toml"
    config.write_text(tiny_config(data_dir, model={"pos": "rope"}, init_from=str(tmp_path / "qwen3")))
    with pytest.raises(ConfigError, match="n_layer=3.*--n_layer=3"):
        train.run([str(config), f"--out_dir={tmp_path / 'run'}"])
    with pytest.raises(ConfigError, match="does not exist"):
        train.run([str(config), f"--out_dir={tmp_path / 'run'}", f"--init_from={tmp_path / 'nothing'}"])


@pytest.mark.fault
def test_init_from_a_checkpoint_whose_weights_are_not_finite_is_one_sentence(tmp_path, data_dir):
    from tests.helpers import run_with_non_finite_weight
    named = run_with_non_finite_weight(tmp_path / "nan_run", float("nan"))
    config = tmp_path / "tiny.toml"
    same_shape = {"pos": "fox", "n_embd": 64, "n_head": 4, "head_dim": 16}  # (eval.tiny's: only the NaN is wrong)
    config.write_text(tiny_config(data_dir, model=same_shape, init_from=str(tmp_path / "nan_run")))
    with pytest.raises(ConfigError) as info:
        train.run([str(config), f"--out_dir={tmp_path / 'run'}"])
    assert str(info.value).startswith(f"init_from: checkpoint {tmp_path / 'nan_run' / 'ckpt.pt'} {named}")
    assert not (tmp_path / "run" / "ckpt.pt").exists()


@pytest.mark.parametrize("weights,message", [
    # a clone made without git-lfs holds the pointer text in place of the weights
    (b"version https://git-lfs.github.com/spec/v1\noid sha256:abcd\nsize 3285752\n",
     "model.safetensors is a git-lfs pointer, not the weights; fetch them with `git lfs pull`"),
    (None, "model.safetensors is not a complete safetensors file \\(.*\\); download or export the model again"),
])
@pytest.mark.fault
def test_weights_that_are_not_a_complete_safetensors_file_are_one_sentence(tmp_path, data_dir, monkeypatch, capsys,
                                                                            weights, message):
    qwen3(tmp_path / "qwen3")
    file = tmp_path / "qwen3" / "model.safetensors"
    file.write_bytes(weights if weights is not None else file.read_bytes()[:5000])  # None: a cut-off download
    config = tmp_path / "tiny.toml"
    config.write_text(tiny_config(data_dir, model={"pos": "rope"}, init_from=str(tmp_path / "qwen3")))
    monkeypatch.setattr("sys.argv", ["train.py", str(config), f"--out_dir={tmp_path / 'run'}"])
    capsys.readouterr()  # (transformers' progress bar while saving)
    with pytest.raises(SystemExit) as exit:
        train.main()
    assert exit.value.code == 2
    err = capsys.readouterr().err
    assert re.fullmatch(f"error: init_from {re.escape(str(tmp_path / 'qwen3'))}: .*{message}.*\n", err), err
    assert "Traceback" not in err and not (tmp_path / "run").exists()
