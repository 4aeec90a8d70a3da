"""deltamatch.reports: the paper's numbers beside ours.

``paper`` (the values in ``paper_reported.yaml``) and ``inputs`` (the pipeline's outputs as tidy frames) feed
``tables`` (pandas) and ``figures`` (seaborn); ``render`` puts them on one page, HTML and Markdown. ``dm-report`` is
``cli``. The tables and figures are the registry ``artefacts`` (inputs, options, page section of each), each built by
its function in ``builders``. Nothing is imported here, so ``import deltamatch.reports`` stays free of pandas and matplotlib.
"""
