"""The report's artefacts as data: one registry that ``dm-report``, the page renderer and the workflow's two report
rules read.

Each entry is one file stem under ``report/tables/`` (a CSV) or ``report/figures/`` (a PNG and the CSV of its
numbers): the function of ``deltamatch.reports.builders`` that builds it, the inputs it reads (which runs, evals,
probes, kernel files, sweep), the command-line options that shape it (scale mapping, metric aliases, gain window),
the config key that enables it, and the page section it appears in, with the section's title and paragraph when it
heads one. The order of the entries is the order of the page's sections.

Adding a table or figure: its builder in ``builders.py`` and one entry here. Standard library only: the workflow loads
this file by its path (no pandas in Snakemake's own environment).
"""

from __future__ import annotations

from dataclasses import dataclass

KINDS = ("table", "figure")
INPUTS = ("runs", "evals", "paper", "probes", "kernel", "sweep", "kernel_table", "recorded_run")
"""Input groups: run summaries, dm-eval results, the paper's values, a dm-probe CSV, the kernel check and bench
(with recorded measurements), the sweep CSV, the kernel table (for the kernel figure), and a pipeline run recorded
earlier on a GPU (a folder under benchmarks/results with its provenance.json)."""
RUN_SETS = ("main", "scale", "figure5", "all", "context")
"""Which runs an artefact reads: the main variant at the main size, the main variant at every size, its Figure 5
sizes, every run, the context-extension variant."""
OPTIONS = ("mapping", "figure5_mapping", "alias", "window")
"""``--scale-of`` and ``--alias`` (the main mapping or Figure 5's), ``--alias`` alone, ``--gain-window``."""


@dataclass(frozen=True)
class Artefact:
    name: str
    """File stem: ``report/tables/<name>.csv`` or ``report/figures/<name>.{png,csv}``."""
    kind: str
    """``table`` or ``figure``."""
    builder: str
    """Function of ``deltamatch.reports.builders``: ``(Inputs, paper) -> frame`` (a table) or ``(grid, numbers)``."""
    inputs: tuple[str, ...]
    """Input groups it reads (``INPUTS``)."""
    runs: str | None = None
    """Which runs, when it reads runs or evals (``RUN_SETS``)."""
    options: tuple[str, ...] = ()
    """Options that shape it (``OPTIONS``)."""
    enabled_by: str | None = None
    """Dotted config key whose value must be truthy for the pipeline to build it (None: always built)."""
    command: str | None = None
    """Its name on dm-report's command line, where that differs from ``name`` (``dm-report table main``)."""
    section: str | None = None
    """The section it is shown in, where that is another artefact's (Figure 1's final bars beside its curves)."""
    title: str = ""
    """Heading of the section it heads."""
    about: str = ""
    """One paragraph: what the artefact is and what the paper measured it on."""
    claim_key: str = ""
    """``artefact`` of the paper's claims shown in its section."""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"artefact {self.name!r}: kind {self.kind!r} is not one of {KINDS}")
        unknown = [*(i for i in self.inputs if i not in INPUTS), *(o for o in self.options if o not in OPTIONS)]
        if unknown or (self.runs not in (None, *RUN_SETS)):
            raise ValueError(f"artefact {self.name!r}: unknown inputs/options/runs {unknown or self.runs!r}")
        if ("runs" in self.inputs or "evals" in self.inputs) != (self.runs is not None):
            raise ValueError(f"artefact {self.name!r}: 'runs' names which runs exactly when it reads runs or evals")

    @property
    def cli_name(self) -> str:
        return self.command or self.name

    @property
    def heads_section(self) -> bool:
        return self.section is None


ARTEFACTS: tuple[Artefact, ...] = (
    Artefact("main_1p67b", "table", "main_table", ("runs", "evals", "paper"), "main", ("mapping",), command="main",
             title="Main table", claim_key="main",
             about="Validation cross-entropy, the evaluation suites and RULER per attention method. Paper: 1.67B hybrid "
                   "(18 GDN + 6 GQA), 30B Nemotron-CC tokens, two seeds. commonsense_max_task_gap_to_bf16 is derived: "
                   "the largest |matched − bf16| over the commonsense tasks, in points, beside the paper's \"within "
                   "one point\"."),
    Artefact("scale", "table", "scale_table", ("runs", "evals", "paper"), "scale", ("mapping",),
             title="Scale table", claim_key="scale",
             about="Validation cross-entropy and suite averages at each model size. Paper: 569M, 1.67B and 5.29B."),
    Artefact("figure1_loss", "figure", "figure1_loss", ("runs", "paper"), "main", ("mapping",),
             title="Figure 1: training loss, final loss and downstream", claim_key="figure1",
             about="Left: training loss per method at the main size. Right: final validation loss and downstream suite "
                   "averages per method (bars: mean over seeds; dots: seeds). train_loss_rise is the final loss (mean "
                   "of the last 10% of steps) minus the lowest such 10% mean after the first 10% (how far a loss "
                   "climbs back; 0 while it still falls)."),
    Artefact("figure1_final", "figure", "figure1_final", ("runs", "evals"), "main", ("alias",),
             section="figure1_loss"),
    Artefact("figure4_gain", "figure", "figure4_gain", ("runs", "paper"), "main", ("mapping", "window"),
             title="Figure 4: gain concentration over training", claim_key="figure4",
             about="The last attention layer's largest key RMSNorm gain and the share of the largest channel in "
                   "Σ_c (g_q,c·g_k,c)², read at the last logged step within the gain window (the paper's first 6,000 "
                   "steps; a shorter run at its end: the window column says which step). The paper's over 99% is "
                   "said of its 5.29B runs and is the share of a few channels, a different statistic: ours, one "
                   "channel's share, can only be smaller. Left and middle (figure4_effects): what the stale δ's error "
                   "does to a step on each run's own activations: the shares of attention rows it sharpens and "
                   "flattens, and per QK channel how consistently heads and sequences agree on the direction it "
                   "pushes the channel's gain (models/instrument.py: delta_error_effects)."),
    Artefact("figure4_effects", "figure", "figure4_effects", ("runs", "paper"), "main", ("mapping", "window"),
             section="figure4_gain"),
    Artefact("figure5_scales", "figure", "figure5_scales", ("runs", "paper"), "figure5", ("figure5_mapping", "window"),
             title="Figure 5: gains and loss at two scales", claim_key="figure5",
             about="Training loss and the largest QK-norm channel gain over training at two model sizes; gain_max is "
                   "the largest gain within the gain window. Paper: 569M (every gain stays within about 0..1.7, a "
                   "range: no difference is computed against it) and 5.29B; ours stand beside the paper scale named "
                   "by the config's report.figure5_scale_of."),
    Artefact("context_gap", "figure", "context_gap", ("runs",), "context", enabled_by="report.context_variant",
             title="Context extension: gap to BF16 over steps", claim_key="context_extension",
             about="Each method's validation-loss gap to BF16 over the context-extension phase (the config's "
                   "report.context_variant). Paper: 1.67B, 8K→64K; the stale gap exceeds 0.01 only after about "
                   "19,000 steps."),
    Artefact("gains", "table", "gain_table", ("runs",), "all", ("window",),
             title="Gains of every run", claim_key="gains",
             about="For every variant, size and method: the last attention layer's largest key gain and gain "
                   "concentration at the window's last logged step, and the largest query or key gain of any layer "
                   "within the window (the paper's Figures 4/5 statistics; its 2.58B pure-GQA and 1.67B Mamba-2 "
                   "findings are read here)."),
    Artefact("table9_probes", "table", "probe_table", ("probes", "paper"), None, ("mapping",), command="probes",
             enabled_by="probe.enabled", title="Table 9: row-sum residual per layer", claim_key="table9",
             about="Normalised row-sum residual |Σ_j dS_ij| / Σ_j |dS_ij| of each δ on one checkpoint's activations, "
                   "before and after the dS cast, and the key-gradient column-sum share: one row per real attention "
                   "layer (last, and layer i for the others) and all_but_last, the paper's summary, where there are "
                   "two or more layers."),
    Artefact("ablations", "table", "ablation_table", ("runs", "evals", "paper"), "all", ("mapping",),
             title="Ablations", claim_key="ablations",
             about="Validation cross-entropy of each variant and each method's gap to BF16 of the same variant."),
    Artefact("runs", "table", "run_table", ("runs",), "all",
             title="Runs: backends, throughput, memory",
             about="Every run of this pipeline: the implementation that trained each kind of mixer (fla's kernels or "
                   "the pure-torch twin for Gated DeltaNet; SDPA, the Triton FP8 kernels, cuDNN FP8 or the reference "
                   "simulation for attention, as the run's summary.json records), steps and tokens, the final "
                   "training loss (mean of the last 10% of steps) and validation CE, median tokens/s and MFU after "
                   "the first 10 steps (which compile the kernels), peak memory (the CUDA allocator's on a GPU, the "
                   "process's resident set on a CPU), the trainer's wall time, and the last attention layer's "
                   "largest key gain and gain concentration."),
    Artefact("sweep", "table", "sweep_table", ("sweep", "paper"), enabled_by="sweep.enabled",
             title="Random-head sweep", claim_key="sweep",
             about="Distance from the softmax-gradient invariant on random attention heads, against the logit spread. "
                   "The paper has no such experiment: beside the row-sum residuals stand the orders of magnitude its "
                   "Table 9 reports for the same measures on a trained 1.67B checkpoint's activations (layers 3-19). "
                   "bf16_dp and maxshift are the paper's Appendix C.4 alternatives (a BF16 dP; a max-shift "
                   "probability encoding) as this harness defines them (kernels/README.md), with the stale δ; "
                   "stale_factored and matched_factored, the factored scale layout of the faster kernel (matched_factored "
                   "runs on the Triton kernels, and its backward on the CUDA ones where they run)."),
    Artefact("sweep", "figure", "figure_sweep", ("sweep",), enabled_by="sweep.enabled", section="sweep"),
    Artefact("kernel_latency", "table", "kernel_table", ("kernel", "paper"), command="kernel",
             enabled_by="kernel.enabled", title="Kernel", claim_key="kernel",
             about="Throughput of the attention kernels (TFLOP/s by FlashAttention's FLOP count) against sequence "
                   "length, the reference shape (head dim 128, N = 8192, causal), backward memory, and the paper's "
                   "kernel statements beside ours. The full table (build check of every compiled kernel, every shape) "
                   "is the linked CSV."),
    Artefact("kernel", "figure", "figure_kernel", ("kernel_table",), enabled_by="kernel.enabled",
             section="kernel_latency"),
    Artefact("recorded_run", "table", "recorded_run_table", ("recorded_run", "paper"), enabled_by="report.recorded_run",
             title="Recorded GPU run (not measured by this run)",
             about="The GPU pipeline run named by the config's report.recorded_run, recorded earlier with its own "
                   "config and kept under benchmarks/results/: nothing in this section was measured by this run, and "
                   "its model and steps are that run's. Per method, the columns of the runs table above; below, "
                   "Table 9 on its probed checkpoint beside the paper's 1.67B values; the figure: its training loss "
                   "per method and its row-sum residuals per attention layer."),
    Artefact("recorded_run_probes", "table", "recorded_probe_table", ("recorded_run", "paper"),
             enabled_by="report.recorded_run", command="recorded_probes", section="recorded_run"),
    Artefact("recorded_run", "figure", "figure_recorded_run", ("recorded_run",), enabled_by="report.recorded_run",
             section="recorded_run"),
)


def of_kind(kind: str) -> dict[str, Artefact]:
    """``{cli name: artefact}`` of one kind, in page order."""
    return {a.cli_name: a for a in ARTEFACTS if a.kind == kind}


def get(kind: str, cli_name: str) -> Artefact:
    found = of_kind(kind)
    if cli_name not in found:
        raise ValueError(f"unknown {kind} {cli_name!r}; choose one of {list(found)}")
    return found[cli_name]


def by_stem(kind: str, name: str) -> Artefact:
    """The artefact whose file stem is ``name``."""
    for artefact in ARTEFACTS:
        if artefact.kind == kind and artefact.name == name:
            return artefact
    raise ValueError(f"no {kind} artefact with the file name {name!r}")


def enabled(artefact: Artefact, config: dict) -> bool:
    """Whether a workflow config builds ``artefact`` (its ``enabled_by`` key, dotted, is truthy)."""
    if artefact.enabled_by is None:
        return True
    value = config
    for part in artefact.enabled_by.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return bool(value)


def parts_of(section: str) -> tuple[str, ...]:
    """The further stems shown in ``section`` beyond its own (Figure 1's final bars, the kernel figure)."""
    return tuple(a.name for a in ARTEFACTS if a.section == section and a.name != section)
