"""deltamatch: the reproduction as one pipeline.

    snakemake --cores all                                     # the embedded default (config/default.yaml), CPU
    snakemake --profile profiles/slurm --configfile config/paper.yaml
    snakemake -f results/default/report/tables/main_1p67b.csv # rebuild one table, nothing else

Stages, one rule file each: data -> train -> eval, probe -> report; kernel and sweep feed the report directly; publish
turns final checkpoints into Hub repos. Rules only wire console scripts; the logic lives in the deltamatch package.
"""

from pathlib import Path

from snakemake.utils import min_version, validate

min_version("9.0")


# A --configfile replaces the embedded default instead of merging into it: Snakemake deep-merges dicts, which would
# leak the default's offline corpus and tiny training settings into the paper config. Keys it omits take the schema
# defaults instead.
if not workflow.overwrite_configfiles:

    configfile: Path(workflow.basedir) / "config" / "default.yaml"


validate(config, "workflow/schemas/config.schema.yaml")


include: "workflow/common.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/kernel.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/eval.smk"
include: "workflow/rules/probe.smk"
include: "workflow/rules/sweep.smk"
include: "workflow/rules/report.smk"
include: "workflow/rules/publish.smk"


rule all:
    default_target: True
    input:
        report_targets(),
        publish_targets(),
    localrule: True
