"""The pipeline the deploy examples run until you put yours in its place: ``docs``, two stages, no model.

The image copies this file to /app/pipeline.py; compose.yaml and keda/worker.yaml start `conveyor worker
/app/pipeline.py:pipe`, and keda/scaledobject.yaml's query names the pipeline ``docs``. Submit work with
`conveyor submit /app/pipeline.py:pipe --input FOLDER` from any machine that reaches the same store.
"""

from __future__ import annotations

from conveyor import Pipeline

pipe = Pipeline("docs")


@pipe.stage
def parse(ctx, source: bytes) -> dict:  # type: ignore[no-untyped-def]
    return {"text": source.decode("utf-8", "replace")}


@pipe.stage(after=parse)
def count(ctx, doc: dict) -> dict:  # type: ignore[no-untyped-def]
    return {"words": len(doc["text"].split())}
