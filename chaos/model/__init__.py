"""Plain types and documents at the bottom of the pipeline: read by every stage, importing none.

jobspec.py       JobSpec: how a user's job is launched and judged
point.py         Point: one place to break a job (``rank0:op17:before``)
fault.py         Fault: one fault of the built-in workload (``rank1:step11:kill``)
grammar.py       reading both from text: ``--point`` and ``--fault``, every error naming the text
contract.py      the names the harness and a job's rank processes share (environment, files)
check.py         Check: one judgement (pass, fail, not judged) with its evidence, from every judge
statehash.py     canonical SHA-256 fingerprints of a training state tree
resultschema.py  the results document as its readers take it: one JSON Schema, its limits, its origin
"""
