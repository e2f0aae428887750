"""A real ``python -m sglang.launch_server`` for the tests, on CPU, with a tiny local model.

* :func:`build_tiny_model` writes a model folder with no weights and nothing from the hub: a
  byte-level BPE tokenizer trained here with ``tokenizers`` (ChatML special tokens and a chat
  template) and a small Qwen2 ``config.json``. The server runs it with ``--load-format dummy``
  (random weights): the tests need real scheduling and a real KV cache, not sensible text. The
  same folder shape with an 8B ``config.json`` gives GPU-realistic timings without weights.
* :class:`SGLangServer` starts the server on 127.0.0.1 with the project's plugin (found by its
  entry point, and switched on with ``AWP_SGLANG_PLUGIN=1``: the plugin is opt-in; pass
  ``env={"AWP_SGLANG_PLUGIN": "0"}`` for a plain server), waits on ``/health_generate`` (a real
  generation), and stops it by PID (SIGTERM, then SIGKILL of the process group after a grace period).

On a CPU-only machine the server needs ``SGLANG_USE_CPU_ENGINE=1`` and the test-only stand-ins in
``cpu_standins/`` on its ``PYTHONPATH`` (gated by ``AWP_TEST_CPU_STANDINS=1``); with CUDA neither
is set (docs/sglang.md, "Tests against a real server").
"""
from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

import httpx

HERE = Path(__file__).resolve().parent
STANDINS = HERE / "cpu_standins"
REPO = HERE.parent.parent

#: Modules the server's import chain needs beyond the in-process test stack (.ci/run installs them).
SERVER_MODULES = ("uvloop", "multipart", "jsonschema", "soundfile", "zstandard", "xgrammar", "uvicorn")

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def stop_process_group(proc: subprocess.Popen | None, grace_s: float, log: IO | None = None) -> None:
    """Stop a server started with ``start_new_session=True``: SIGTERM to it (its children exit
    with it), SIGKILL to its process group (its own session: only its processes) when it is still
    running after ``grace_s``; then close its ``log``. Nothing to do for a process that exited.
    The SGLang servers here and the sglang-router of ``bench/engine_router.py`` stop this way."""
    if proc is not None and proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    if log is not None and not log.closed:
        log.close()


def missing_server_modules() -> list[str]:
    return [m for m in ("sglang", *SERVER_MODULES) if importlib.util.find_spec(m) is None]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build_tiny_model(root: Path, *, hidden: int = 128, layers: int = 2, vocab: int = 2048,
                     text: str | None = None) -> Path:
    """Tokenizer trained on local text + a Qwen2 config; no weights (serve with ``--load-format dummy``)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from serving_hooks.replay_prompts import WORDS

    root.mkdir(parents=True, exist_ok=True)
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = text or (" ".join(WORDS) + "\n") * 50 + "user assistant system tok\n" * 20
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus.splitlines(), trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   bos_token=None, unk_token=None)
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(root)
    eos = fast.convert_tokens_to_ids("<|im_end|>")
    config = {
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": hidden,
        "intermediate_size": 2 * hidden, "num_hidden_layers": layers, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": hidden // 4, "vocab_size": vocab,
        "max_position_embeddings": 8192, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
        "hidden_act": "silu", "tie_word_embeddings": True, "torch_dtype": "float32",
        "bos_token_id": eos, "eos_token_id": eos, "use_sliding_window": False,
    }
    (root / "config.json").write_text(json.dumps(config, indent=1))
    (root / "generation_config.json").write_text(json.dumps({"eos_token_id": eos, "do_sample": False}))
    return root


class SGLangServer:
    """One real SGLang server process (``python -m sglang.launch_server``) on 127.0.0.1."""

    def __init__(self, model_dir: Path, log_path: Path, *, extra_args: list[str] | None = None,
                 env: dict[str, str] | None = None, port: int | None = None) -> None:
        self.model_dir, self.log_path = Path(model_dir), Path(log_path)
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.extra_args = list(extra_args or [])
        self.extra_env = dict(env or {})
        self.proc: subprocess.Popen | None = None
        self.startup_s: float | None = None

    def command(self) -> list[str]:
        return [sys.executable, "-m", "sglang.launch_server", "--model-path", str(self.model_dir),
                "--load-format", "dummy", "--host", "127.0.0.1", "--port", str(self.port),
                "--dtype", "float32", "--sleep-on-idle", "--log-level", "info", *self.extra_args]

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        cpu = not _cuda_available()
        paths = [str(STANDINS)] if cpu else []
        paths += [str(REPO), *[p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]]
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
        env.update({"AWP_SGLANG_PLUGIN": "1",  # opt-in (serving_hooks.sglang_plugin)
                    "SGLANG_RUST_BUILD_MODE": "never", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                    "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"})
        if cpu:
            env.update({"SGLANG_USE_CPU_ENGINE": "1", "AWP_TEST_CPU_STANDINS": "1"})
        env.update(self.extra_env)
        return env

    def start(self, timeout_s: float = 420.0) -> "SGLangServer":
        t0 = time.monotonic()
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(self.command(), stdout=self._log, stderr=subprocess.STDOUT,
                                     env=self.environment(), cwd=str(self.log_path.parent),
                                     start_new_session=True)
        deadline = t0 + timeout_s
        with httpx.Client(timeout=30.0, trust_env=False) as client:
            while True:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"SGLang server exited with {self.proc.returncode} during start-up; "
                                       f"last output:\n{self.log_tail()}")
                if time.monotonic() > deadline:
                    self.stop()
                    raise TimeoutError(f"SGLang server not ready after {timeout_s:.0f}s:\n{self.log_tail()}")
                try:
                    if client.get(self.url + "/health_generate").status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(1.0)
        self.startup_s = time.monotonic() - t0
        return self

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def log_tail(self, n: int = 40) -> str:
        return "\n".join(self.log_text().splitlines()[-n:])

    def stop(self, grace_s: float = 20.0) -> None:
        """SIGTERM to the launcher, SIGKILL to its process group after ``grace_s``
        (:func:`stop_process_group`)."""
        stop_process_group(self.proc, grace_s, getattr(self, "_log", None))


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()
