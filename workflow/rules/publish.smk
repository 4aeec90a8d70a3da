# Publishing: a final checkpoint -> a Hub model repo (or, with publish.dry_run, the exact folder that would be
# uploaded). The token comes from HF_TOKEN or `hf auth login`; it never appears on a command line or in a file.


rule publish:
    input:
        checkpoint=f"{RUN}/final",
        summary=f"{RUN}/summary.json",
        data=DATA,
        evals=lambda wildcards: evals([Run(wildcards.variant, wildcards.size, wildcards.method, int(wildcards.seed))]),
        citation=PAPER,  # the paper's BibTeX lives in the report's paper values (its 'citation' key)
    output:
        directory(f"{RESULTS}/publish/{TAG}"),
    log:
        f"{LOGS}/publish/{TAG}.log",
    benchmark:
        f"{BENCH}/publish/{TAG}.tsv"
    localrule: True  # uploads need the network, which login nodes have and compute nodes often lack
    conda:
        "../../envs/publish.yaml"
    threads: 1
    resources:
        **resources_of("light"),
    params:
        repo_id=repo_id,
        dry_run="--dry-run" if config["publish"]["dry_run"] else "",
    shell:
        "dm-publish --checkpoint {input.checkpoint} --repo-id {params.repo_id} --summary {input.summary}"
        " --data {input.data} --evals {input.evals} --citation {input.citation} {params.dry_run} --out {output}"
        " > {log} 2>&1"
