"""deltamatch.models.data: the offline corpus, its tokenizer, memmap token shards, and the Hub path for clusters.

Flow: documents (``corpus`` offline, ``hub`` on a cluster) -> tokenizer (``tokenizer``) -> ``shards`` (memmap files +
``manifest.json``) -> ``loader`` (fixed-length windows in a seeded, resumable order). ``dm-prepare-data`` is ``cli``.
"""
