"""Opt-in (``pytest --real-engine -m real_engine tests/test_real_engine.py``): the LLM example
of docs/tutorials/llm-agent.md against a real engine, Hugging Face ``transformers serve``, with
a tiny Qwen2 model built here (a byte-level tokenizer trained on a few lines, one layer of
random weights: nothing is downloaded). SIGKILLed after its first checkpoint, the example
resumes and finishes; and the engine's answers show why ``require=`` exists: it ignores
``logprobs``. Skipped without ``--real-engine``, or when ``transformers[serving]`` and
``torch`` are not installed (``pip install 'transformers[serving]' torch==2.13.0``)."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import trio

from gymckpt.gym_adapter.environments.openai_model import ModelResponseIncomplete, openai_model

pytestmark = [pytest.mark.real_engine, pytest.mark.subprocess]

TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] or '' }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def _llm_example() -> str:
    """The LLM example's code block (as tests/test_readme.py reads it)."""
    page = Path(__file__).resolve().parent.parent / "docs" / "tutorials" / "llm-agent.md"
    pattern = r"<!-- llm-example -->\n```[a-z]*\n(.*?)```\n<!-- /llm-example -->"
    m = re.search(pattern, page.read_text(), re.S)
    assert m, f"{page} has no llm-example block"
    return m.group(1)


def _tiny_qwen2(where: Path) -> Path:
    """A one-layer Qwen2 with random weights and a byte-level tokenizer, saved to ``where``."""
    pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from tokenizers import ByteLevelBPETokenizer

    bpe = ByteLevelBPETokenizer()
    corpus = [f"What is {n} + {n * 7}? The answer is {8 * n}." for n in range(64)]
    special = ["<|endoftext|>", "<|user|>", "<|assistant|>", "<|tool|>", "<|system|>"]
    bpe.train_from_iterator(corpus, vocab_size=400, special_tokens=special)
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=bpe._tokenizer, eos_token="<|endoftext|>", pad_token="<|endoftext|>"
    )
    tokenizer.chat_template = TEMPLATE
    config = transformers.Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=2048,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = transformers.Qwen2ForCausalLM(config)
    model.generation_config.max_new_tokens = 8
    model.save_pretrained(where)
    tokenizer.save_pretrained(where)
    return where


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def engine(tmp_path: Path):  # type: ignore[no-untyped-def]
    """``transformers serve`` on loopback with the tiny model: (base_url, model name)."""
    model = _tiny_qwen2(tmp_path / "tiny-qwen2")
    exe = shutil.which("transformers") or str(Path(sys.executable).parent / "transformers")
    port = _free_port()
    log = open(tmp_path / "serve.log", "wb")  # noqa: SIM115 (the child writes it)
    proc = subprocess.Popen(
        [exe, "serve", "--host", "127.0.0.1", "--port", str(port), "--device", "cpu", str(model)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
    )
    try:
        end = time.monotonic() + 120
        while True:
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
            assert time.monotonic() < end, "transformers serve did not start in 120 s"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                    break
            except OSError:  # not listening yet: wait for its exit, at most 0.5 s, then ask again
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=0.5)
        yield f"http://127.0.0.1:{port}/v1", str(model)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


@pytest.mark.timeout(900)
def test_llm_example_against_transformers_serve(engine, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    base_url, model = engine
    script = tmp_path / "llm.py"
    script.write_text(_llm_example())
    env = {**os.environ, "OPENAI_BASE_URL": base_url, "OPENAI_MODEL": model}
    first = subprocess.Popen(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert first.stdout is not None
        line = first.stdout.readline()  # the first checkpoint
        assert line.startswith("run-0001 True"), line
        first.send_signal(signal.SIGKILL)
    finally:
        first.kill()
        first.wait(60)
        assert first.stdout is not None
        first.stdout.close()
    assert first.returncode == -signal.SIGKILL
    again = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.strip(), "the resumed run trained no step"


@pytest.mark.timeout(300)
def test_transformers_serve_ignores_logprobs_and_require_says_so(engine) -> None:  # type: ignore[no-untyped-def]
    base_url, model = engine

    async def ask() -> None:
        client = openai_model(base_url=base_url, model=model, require=("logprobs",))
        request = {"messages": [{"role": "user", "content": "What is 1 + 7?"}], "logprobs": True}
        try:
            with pytest.raises(ModelResponseIncomplete, match=r"has no 'logprobs'") as caught:
                await client("0-0:t0-0000000000000000-c0", request, None)
            assert base_url in str(caught.value)
        finally:
            await client.aclose()

    trio.run(ask)
