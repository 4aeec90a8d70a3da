"""The kernel benchmark's FLOP convention and its refusals (the timing itself needs a GPU: benchmarks/)."""

import pytest
import torch

from deltamatch.kernels import bench


def test_flop_convention_is_flashattention_s():
    fwd = bench.flops(2, 3, 1024, 128, causal=False, bwd=False)
    assert fwd == 4 * 2 * 3 * 1024**2 * 128
    assert bench.flops(2, 3, 1024, 128, causal=True, bwd=False) == fwd / 2
    assert bench.flops(2, 3, 1024, 128, causal=False, bwd=True) == 3.5 * fwd  # backward 2.5× forward


def test_unknown_method_is_named(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        bench.main(["--out", str(tmp_path), "--methods", "matched", "flashinfer"])
    assert exit_.value.code == 2 and "unknown methods ['flashinfer']" in capsys.readouterr().err


def test_the_config_file_carries_every_choice_and_flags_override_it(tmp_path):
    """What the pipeline writes from config key kernel.bench (workflow/rules/kernel.smk) is a BenchConfig file."""
    from deltamatch.config import load_with_flags

    path = tmp_path / "bench.yaml"
    path.write_text("head_dims: [128]\nseq_lens: [8192]\ncausal: [true]\nmethods: [matched, sdpa_cudnn_bf16]\n"
                    "memory: true\n")
    cfg = load_with_flags(bench.BenchConfig, path, {"seq_lens": [4096]})
    assert (cfg.head_dims, cfg.seq_lens, cfg.causal, cfg.methods, cfg.memory) == (
        [128], [4096], [True], ["matched", "sdpa_cudnn_bf16"], True)
    path.write_text("memroy: true\n")
    with pytest.raises(ValueError, match="memroy"):
        load_with_flags(bench.BenchConfig, path, {})


def test_the_profile_is_asked_for_by_flag_or_config_and_names_kernels_short(tmp_path, monkeypatch):
    """``--profile`` (or config key ``profile``) adds the kernel-by-kernel profile to the run; its kernel names drop
    template arguments and the ``void`` of CUDA's demangled names."""
    seen = []
    monkeypatch.setattr(bench, "run", lambda cfg, out: seen.append(cfg) or __import__("pandas").DataFrame())
    assert bench.main(["--out", str(tmp_path), "--profile", "--methods", "matched"]) == 0
    assert bench.main(["--out", str(tmp_path), "--methods", "matched"]) == 0
    assert [c.profile for c in seen] == [True, False] and seen[0].profile_seq_len == 8192
    assert bench.kernel_name("void dm_fwd_wide<true, 2>(Params, Maps)") == "dm_fwd_wide"
    assert bench.kernel_name("_attn_fwd_kernel") == "_attn_fwd_kernel" and len(bench.kernel_name("k" * 99)) == 70


def test_run_writes_every_table_and_records_a_method_that_cannot_run(tmp_path, monkeypatch):
    """``run`` with its measurements stood in for (no GPU here): each table as CSV and as Markdown under its own
    header (date, commit, GPU, torch, then what it measured, then the methods not run and why); a method that raises
    keeps its row with the error, and the others go on."""
    import pandas as pd

    from deltamatch.reports.inputs import bench_provenance

    def timed(method, b, h, n, d, causal, cfg):
        if method == "matched" and n == 4096:
            raise RuntimeError("out of memory")
        return dict(method=method, head_dim=d, seq_len=n, batch=b, heads=h, causal=causal, fwd_bwd_ms=1.0)

    for name, stand_in in (
            ("time_method", timed),
            ("peak_backward_memory", lambda m, n: dict(method=m, seq_len=n, peak_extra_backward_gib=0.5)),
            ("kernel_profile", lambda m, n, iters: pd.DataFrame([dict(method=m, kernel=k, ms_per_step=ms)
                                                                  for k, ms in (("fwd", 1.0), ("bwd", 2.0))])),
            ("_available", lambda m: "not here" if m == "cudnn_fp8" else None)):
        monkeypatch.setattr(bench, name, stand_in)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda: "NVIDIA H200")
    cfg = bench.BenchConfig(head_dims=[128], seq_lens=[4096, 8192], causal=[True], memory=True, profile=True,
                            memory_seq_lens=[16384], methods=["matched", "sdpa_cudnn_bf16", "cudnn_fp8"])
    df = bench.run(cfg, str(tmp_path))
    assert list(zip(df["method"], df["seq_len"])) == [("matched", 4096), ("sdpa_cudnn_bf16", 4096),
                                                      ("matched", 8192), ("sdpa_cudnn_bf16", 8192)]
    assert df["error"].notna().tolist() == [True, False, False, False] and "out of memory" in df["error"][0]
    for stem, title, rows in (("kernel_bench", "Kernel benchmark", 4), ("kernel_memory", "Backward memory", 2),
                              ("kernel_profile", "Kernel time per step", 4)):
        assert len(pd.read_csv(tmp_path / f"{stem}.csv")) == rows, stem
        text = (tmp_path / f"{stem}.md").read_text()
        assert text.startswith(f"# {title}\n\ndate ") and "cudnn_fp8 not run: not here" in text, stem
        assert bench_provenance(tmp_path / f"{stem}.md")["gpu"] == "NVIDIA H200", stem
    assert "N = 8192" in (tmp_path / "kernel_profile.md").read_text()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without a GPU")
def test_refuses_to_run_without_cuda(tmp_path):
    with pytest.raises(ValueError, match="CUDA"):
        bench.run(bench.BenchConfig(methods=["matched"]), str(tmp_path))


def test_the_fa3_class_baseline_says_why_it_cannot_run(monkeypatch):
    """``fa4_cute_bf16`` (FlashAttention's CuTe-DSL kernels) is a baseline the bench accepts; where flash_attn.cute does
    not import, the bench's header names why and points at the script that stages it (tools/device/fetch_fa4.sh)."""
    import builtins

    assert bench.FA4 in bench.BASELINES and bench.BenchConfig(methods=[bench.FA4]).methods == [bench.FA4]
    real_import = builtins.__import__

    def no_fa4(name, *args, **kwargs):
        if name.startswith("flash_attn"):
            raise ModuleNotFoundError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_fa4)
    reason = bench._available(bench.FA4)
    assert reason.startswith("flash-attn-4 (flash_attn.cute) does not import: ModuleNotFoundError")
    assert "tools/device/fetch_fa4.sh" in reason
    assert bench._available("sdpa_flash_bf16") is None
