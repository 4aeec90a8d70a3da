"""dm-probe's Table 9 rows equal residual_summary on the same captured activations."""

import pandas as pd
import pytest

from deltamatch.evals.probe import COLUMNS, ProbeConfig, heldout_batch, load_checkpoint, main, probe_rows


def test_probe_rows_match_residual_summary(tiny_run, tmp_path):
    from deltamatch.kernels.measures import residual_summary
    from deltamatch.models.instrument import capture_attention_io

    ckpt, data = tiny_run
    model, tok = load_checkpoint(ckpt)
    batch = heldout_batch(tok, data, ProbeConfig(batch_size=1, seq_len=64))
    assert batch.shape == (1, 64)
    frame = probe_rows(model, batch)
    io = capture_attention_io(model, batch, batch)
    assert sorted(frame.layer.unique()) == sorted(io)
    for layer, (q, k, v, do) in io.items():
        for kind, values in residual_summary(q, k, v, do, causal=True).items():
            row = frame[(frame.layer == layer) & (frame.delta == kind)].iloc[0]
            for col, val in values.items():
                assert row[col] == pytest.approx(val, rel=1e-6)

    out = tmp_path / "probe.csv"
    main(["--checkpoint", str(ckpt), "--data", str(data), "--out", str(out), "--batch-size", "1", "--seq-len", "64"])
    written = pd.read_csv(out)
    assert list(written.columns) == COLUMNS
    assert set(written.delta) == {"stale", "consistent", "matched"}
    assert (written[["before_cast", "after_cast", "dk_colsum"]] >= 0).all().all()
