"""The four stages of a run, in the order a document goes through them (``preprocess.executors.plan`` wires them):

    documents (per part: files) -> index (barrier) -> instances (per part: units) -> shards (barrier)

``documents``: input files read, cleaned and tokenized into the document store. ``index``: the store counted into the
corpus index. ``instances``: pairs (``pairs``) or packed rows (``packed``) built from the store and written as pieces
by key range. ``shards``: the pieces assembled into shuffled shards. Each module holds its stage's Beam transforms and
DoFns, which delegate to the pure modules of ``preprocess`` that it names; they meet at files laid out as
``preprocess.layout`` says.
"""
