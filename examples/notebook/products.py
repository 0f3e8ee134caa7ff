"""The example's table and pipeline: 40 products in a Parquet file, described by a model.

``write_table(path)`` writes the table (``sku``, ``description`` with a ``NAME:`` line, ``category``);
``pipe`` reads each description, asks the model for a record (the provider simulator in the example, any
OpenAI-compatible endpoint through OPENAI_BASE_URL/OPENAI_API_KEY), and accepts it when it fits the schema, names
only what the description names and is sure enough. Worker processes import this file to load ``pipe``.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel

from conveyor import Pipeline, Retry
from conveyor.acceptance import Accept, Answer, found_in

TOOLS = ["drill", "saw", "sander", "router", "planer", "jigsaw", "grinder", "lathe", "press", "welder"]
KINDS = ["cordless", "bench", "compact", "heavy-duty"]
PROMPT = 'Describe the product in one sentence, as JSON: "names", "summary", "keywords", "confidence".'


def rows() -> list[dict[str, str]]:
    """Forty products, the same on every machine."""
    return [{"sku": f"SKU-{i:04d}",
             "description": f"NAME: {tool} - a {kind} {tool} for the workshop, model {i}",
             "category": "power tools" if i % 3 else "machines"}
            for i, (kind, tool) in enumerate((k, t) for t in TOOLS for k in KINDS)]


def write_table(path: str | Path) -> Path:
    """The products as a Parquet file at ``path``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows()), str(path))
    return Path(path)


class Product(BaseModel):
    names: list[str]
    summary: str
    keywords: list[str]
    confidence: float


pipe = Pipeline("products", retry=Retry(max_attempts=4, base=0.2, cap=2))


@pipe.stage(version="1")
def parse(ctx, source: bytes) -> dict:
    text = source.decode()
    return {"text": text, "name_line": text.splitlines()[0]}


@pipe.stage(after=parse, version="1", config={"model": "sim-1"},
            accept=Accept(schema=Product, repair=True, checks=[found_in("names", lambda doc: doc["name_line"])],
                          confidence="confidence", threshold=0.7))
async def describe(ctx, doc: dict) -> Answer:
    answer = await ctx.chat([{"role": "system", "content": PROMPT}, {"role": "user", "content": doc["text"]}],
                            model=ctx.config["model"], json_mode=True, prompt_version="products@1")
    return Answer(answer.text)
