"""The zoo's manifest: how to run each script, for how many steps, and what to compare.

One ``Entry`` per way of running a script (a script may appear twice, e.g. on 1 and 2 ranks).
``args`` and ``env`` values are format strings: ``{run}`` is the run's folder (the data of
``prepare`` is copied there first; it is the working directory unless ``cwd`` is "script"),
``{steps}`` the step count, ``{last}`` the step count less one, and ``{size}`` the step count
run through ``size`` (a dataset size that gives that many steps).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

# Lines of Hugging Face logging: a timestamp, and the Trainer's speed figures.
_HF_MASKS = (
    r"\d\d/\d\d/\d\d\d\d \d\d:\d\d:\d\d",
    r"'train_runtime': '?[0-9.]+'?",
    r"'train_(samples|steps)_per_second': '?[0-9.]+'?",
    r"train_(runtime|samples_per_second|steps_per_second)\s*=\s*\S+",
    r"\d+(\.\d+)?(it/s|s/it)",
    r"\[\d\d:\d\d(:\d\d)?<[^\]]*\]",
)
# Progress bars (Lightning's, rich or tqdm, go to stdout): elapsed and remaining times, rates.
# rich pads each line to the bar's width, which the rate's digits change: leading blanks too.
# rich bars: their length and the trailing "•" column follow the width the rate's digits leave
_PROGRESS_MASKS = (r"\d+(\.\d+)?(it/s|s/it)", r"\d+:\d\d(:\d\d)?(\s*•.*)?", r"\?it/s", r"^ +", r"[━╸╺]+")


def _run_clm(*extra: str, batch: str = "4") -> tuple[str, ...]:
    """run_clm.py training a 2-layer GPT-2 of width 32 from a config, with the tokenizer of datagen."""
    return ("--model_type", "gpt2",
            "--config_overrides", "n_embd=32,n_layer=2,n_head=2,n_positions=64,vocab_size=400",
            "--tokenizer_name", "{run}/tokenizer", "--train_file", "{run}/train.txt", "--do_train",
            "--output_dir", "{run}/out", "--max_steps", "{steps}", "--per_device_train_batch_size", batch,
            "--block_size", "32", "--use_cpu", "--report_to", "none", "--logging_steps", "1",
            "--save_strategy", "no", "--seed", "42", *extra)


def _train_gpt2(total_batch_size: str, *extra: str) -> tuple[str, ...]:
    """llm.c's train_gpt2.py on the tiny d2 model, micro-batches of 2 x 32 tokens."""
    return ("--input_bin", "{run}/train.bin", "--model", "d2", "--batch_size", "2", "--sequence_length", "32",
            "--total_batch_size", total_batch_size, "--num_iterations", "{steps}", "--write_tensors", "0", *extra)


_LLMC_MASKS = (r"\(\d+\.\d+ ms \| \d+ tok/s\)", r"avg: \d+\.\d+ms", r"avg: nanms")


@dataclass(frozen=True, kw_only=True)
class Entry:
    name: str
    script: str  # relative to zoo/
    covers: tuple[str, ...]
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    ranks: int = 1
    smoke_steps: int = 4
    full_steps: int = 20
    size: Callable[[int], int] = lambda steps: steps  # {size}: a dataset size giving that many steps
    steps_taken: int = 1  # optimizer steps (advisor steps) per unit of {steps}
    prepare: str | None = None  # a datagen.PREPARE key
    cwd: str = "run"  # "run" or "script"
    masks: tuple[str, ...] = ()  # regexes: what matches is replaced before stdout is compared
    loss_pattern: str | None = None  # regex: the printed losses, compared as printed
    artifacts: tuple[str, ...] = ()  # globs under the run folder: checkpoints whose tensors are compared
    smoke: bool = True  # in the CI smoke subset
    timeout_s: int = 420  # per run; a smoke run gets at most SMOKE_TIMEOUT_S (zoo/conformance.py)

    def expected_steps(self, steps: int) -> int:
        return steps * self.steps_taken


ENTRIES: tuple[Entry, ...] = (
    Entry(
        name="hf_clm", script="hf_clm/run_clm.py", prepare="hf_clm",
        # 6 ms steps: 20 of them end before an apply's window does (apply at step 16, the job
        # over at 19, "interrupted"); 60 give the window room and still run in under a second.
        full_steps=60,
        covers=("Hugging Face Trainer", "GPT-2 from a config", "tied weights"),
        args=_run_clm(),
        masks=_HF_MASKS, loss_pattern=r"'loss': '?([0-9.e+-]+)", artifacts=("out/model.safetensors",),
    ),
    Entry(
        name="hf_clm_ddp_accum", script="hf_clm/run_clm.py", prepare="hf_clm", ranks=2, smoke=False,
        covers=("Hugging Face Trainer", "DDP", "gradient accumulation (no_sync)"),
        args=_run_clm("--gradient_accumulation_steps", "2", batch="2"),
        # Both ranks call load_dataset at once: which one prepares the cache and which finds it
        # ready (and so which log lines appear) is a race in any run; those lines are left out.
        masks=_HF_MASKS + (r"^.* - (INFO|WARNING) - datasets\..*$",), loss_pattern=r"'loss': '?([0-9.e+-]+)", artifacts=("out/model.safetensors",),
    ),
    Entry(
        name="hf_clm_compile", script="hf_clm/run_clm.py", prepare="hf_clm", smoke=False,
        covers=("Hugging Face Trainer", "torch.compile"),
        args=_run_clm("--torch_compile"),
        masks=_HF_MASKS, loss_pattern=r"'loss': '?([0-9.e+-]+)", artifacts=("out/model.safetensors",),
    ),
    Entry(
        name="accelerate_nlp", script="accelerate_nlp/nlp_example.py", smoke_steps=6, full_steps=21,
        covers=("accelerate loop", "bf16 autocast", "variable sequence lengths per batch"),
        args=("--cpu", "--mixed_precision", "bf16"),
        # three epochs of batches of 16 (the script's own): {steps} is a multiple of 3
        env={"ZOO_DATASET_SIZE": "{size}", "ZOO_TEST_SIZE": "32"}, size=lambda n: 16 * n // 3,
    ),
    Entry(
        name="accelerate_accum", script="accelerate_accum/gradient_accumulation.py", ranks=2, smoke_steps=6, full_steps=21,
        covers=("accelerate loop", "DDP", "no_sync accumulation (accelerator.accumulate)"),
        args=("--cpu", "--gradient_accumulation_steps", "2"),
        env={"ZOO_DATASET_SIZE": "{size}", "ZOO_TEST_SIZE": "32"},
        # three epochs; per rank, two micro-batches of 16 per optimizer step
        size=lambda n: 2 * 16 * 2 * n // 3,
    ),
    Entry(
        name="lightning_lm", script="lightning_lm/transformer.py", prepare="lightning_lm",
        covers=("Lightning (LightningModule + Trainer)", "gradient clipping"),
        env={"ZOO_STEPS": "{steps}"}, masks=_PROGRESS_MASKS,
        artifacts=("lightning_logs/version_0/checkpoints/*.ckpt",),
    ),
    Entry(
        name="nanogpt_compile", script="nanogpt/train.py", prepare="nanogpt", cwd="script",
        covers=("torch.compile (inductor)", "tied-weight GPT", "nanoGPT"),
        args=("--device=cpu", "--compile=True", "--dtype=float32", "--dataset={run}/chars", "--out_dir={run}/out",
              "--n_layer=2", "--n_head=2", "--n_embd=32", "--block_size=32", "--batch_size=4",
              "--gradient_accumulation_steps=1", "--max_iters={last}", "--eval_interval={last}", "--eval_iters=2",
              "--log_interval=1", "--warmup_iters=2", "--lr_decay_iters={steps}"),
        masks=(r"time \d+\.\d+ms, mfu -?\d+\.\d+%",), loss_pattern=r"iter \d+: loss ([0-9.]+)",
        artifacts=("out/ckpt.pt",),
    ),
    Entry(
        name="llmc", script="llmc/train_gpt2.py", prepare="llmc",
        covers=("llm.c-style trainer", "tied-weight GPT", "gradient accumulation"),
        args=_train_gpt2("128", "--device", "cpu"),
        masks=_LLMC_MASKS,
        loss_pattern=r"train loss ([0-9.]+)",
    ),
    Entry(
        name="llmc_ddp", script="llmc/train_gpt2.py", prepare="llmc", ranks=2, smoke=False,
        covers=("llm.c-style trainer", "DDP", "require_backward_grad_sync accumulation"),
        args=_train_gpt2("256"),
        masks=_LLMC_MASKS,
        loss_pattern=r"train loss ([0-9.]+)",
    ),
    Entry(
        name="llmc_compile", script="llmc/train_gpt2.py", prepare="llmc", smoke=False,
        covers=("llm.c-style trainer", "torch.compile of a plain nn.Module"),
        args=_train_gpt2("64", "--device", "cpu", "--compile", "1"),
        masks=_LLMC_MASKS,
        loss_pattern=r"train loss ([0-9.]+)",
    ),
    Entry(
        name="fsdp2", script="fsdp2/example.py", ranks=2,
        covers=("FSDP2 (fully_shard)", "meta-device init", "distributed checkpoint"),
        env={"ZOO_STEPS": "{steps}"}, artifacts=("checkpoints/dtensor_api/*/*.pt",),
    ),
    Entry(
        name="tensor_parallel", script="tensor_parallel/tensor_parallel_example.py", ranks=2,
        covers=("tensor parallel (DTensor)",), env={"ZOO_STEPS": "{steps}"},
    ),
    Entry(
        name="ddp_tutorial", script="ddp_tutorial/multigpu_torchrun.py", ranks=2,
        covers=("DDP (the DDP tutorial series)", "DistributedSampler", "snapshot"),
        args=("1", "1", "--batch_size", "32"), env={"ZOO_DATASET_SIZE": "{size}"}, size=lambda n: 2 * 32 * n,
        artifacts=("snapshot.pt",),
    ),
    Entry(
        name="amp_recipe", script="amp_recipe/amp_recipe.py", smoke_steps=2, full_steps=4, steps_taken=6,
        covers=("AMP with GradScaler (float16 autocast)", "two models in one script"),
        env={"ZOO_STEPS": "{steps}"}, masks=(r"Total execution time = \d+\.\d+ sec",),
    ),
    Entry(
        name="dcgan", script="dcgan/main.py",
        covers=("GAN (two optimizers)", "DataLoader workers (fork)", "BatchNorm"),
        args=("--dataset", "fake", "--workers", "2", "--batchSize", "16", "--nz", "16", "--ngf", "8", "--ndf", "8",
              "--niter", "1", "--manualSeed", "7", "--outf", "{run}/out"),
        env={"ZOO_DATASET_SIZE": "{size}"}, size=lambda n: 16 * n,
        loss_pattern=r"Loss_D: ([0-9.]+) Loss_G: ([0-9.]+)", artifacts=("out/*.pth",),
    ),
    Entry(
        name="word_lm", script="word_lm/main.py", prepare="word_lm",
        covers=("manual SGD (p.data.add_)", "LSTM", "tied weights", "variable sequence lengths (short last batch)"),
        args=("--data", "{run}/wikitext-2", "--epochs", "1", "--emsize", "32", "--nhid", "32", "--tied",
              "--log-interval", "1", "--save", "{run}/model.pt"),
        masks=(r"ms/batch +\d+\.\d+", r"time: +\d+\.\d+s"), loss_pattern=r"loss +([0-9.]+)",
        artifacts=("model.pt",),
    ),
    Entry(
        name="regression", script="regression/main.py", smoke_steps=6, full_steps=30,
        covers=("manual SGD (param.data.add_)", "no optimizer"), env={"ZOO_STEPS": "{steps}"},
    ),
    Entry(
        name="lbfgs_sine", script="lbfgs_sine/train.py", prepare="lbfgs_sine", smoke_steps=2, full_steps=8,
        covers=("LBFGS closure", "LSTMCell", "float64"), args=("--steps", "{steps}"),
        loss_pattern=r"^loss: (\S+)",
    ),
    Entry(
        name="maml", script="maml/maml-omniglot-transforms.py", prepare="maml",
        covers=("torch.func grad inside vmap (MAML)", "functional parameters (make_functional_with_buffers)",
                "second-order gradients"),
        args=("--device", "cpu", "--task_num", "2", "--k_spt", "1", "--k_qry", "5"),
        env={"ZOO_EPOCHS": "1", "ZOO_TRAIN_CLASSES": "{size}"}, size=lambda n: 2 * n,
        masks=(r"Time: \d+\.\d+",),
    ),
    Entry(
        name="moe", script="moe/cifar10_example.py",
        covers=("mixture of experts (sparse gating)", "DataLoader workers (fork)"),
        env={"ZOO_DATASET_SIZE": "{size}", "ZOO_TEST_SIZE": "128"}, size=lambda n: 64 * n,
    ),
    Entry(
        name="mingpt_adder", script="mingpt/adder.py",
        covers=("minGPT trainer", "DataLoader workers (fork)", "callbacks"),
        args=("--trainer.max_iters={steps}", "--trainer.num_workers=2", "--system.work_dir=out",
              "--data.ndigit=1"),
        masks=(r"iter_dt \d+\.\d+ms",), loss_pattern=r"train loss ([0-9.]+)", artifacts=("out/model.pt",),
    ),
)

BY_NAME = {entry.name: entry for entry in ENTRIES}
