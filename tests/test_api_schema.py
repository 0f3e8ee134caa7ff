"""The OpenAPI document tells the truth: schemathesis fuzzes every operation of a real `conveyor serve` (SQLite)
with requests drawn from /openapi.json, valid and invalid, and no answer is a 5xx or differs from what the
document declares (status code, content type, body schema). Bounded: a few examples per operation, no shrinking.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)
from schemathesis.generation import GenerationMode

from tests.apiserver import SMALL_PIPELINE, Server, served
from tests.helpers import write_pipeline

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
# Examples per operation: valid requests, then invalid ones (which mostly meet the same validation, so fewer).
EXAMPLES = {GenerationMode.POSITIVE: 5, GenerationMode.NEGATIVE: 3}
CALL_TIMEOUT_S = 10  # an event stream that never closed would be a failure, not a hang


def test_every_operation_answers_as_the_openapi_document_says(tmp_path: Path) -> None:
    target = write_pipeline(tmp_path, SMALL_PIPELINE)
    with served(tmp_path, f"sqlite:///{tmp_path}/conveyor.db", target, workers=1) as server:
        token = server.token()
        job_id = finished_job(server, token)
        known = {"job_id": job_id, "run_id": job_id}  # so that reads of a job (a run) reach more than their 404
        schema = schemathesis.openapi.from_url(f"{server.url}/openapi.json")
        operations = [result.ok() for result in schema.get_all_operations()]
        assert {op.label for op in operations} >= {"POST /v1/jobs", "GET /v1/jobs/{job_id}",
                                                   "GET /v1/jobs/{job_id}/events"}
        failures = [f for operation in operations for f in fuzz_operation(operation, server.url, token, known)]
    assert not failures, "\n\n".join(failures)


def finished_job(server: Server, token: str) -> str:
    with server.client(token) as client:
        answer = client.post("/v1/jobs", json={"text": "a document for the schema run"})
        assert answer.status_code == 202, answer.text
    job_id: str = answer.json()["job_id"]
    assert server.wait_for(token, job_id, ("completed",))["status"] == "completed"
    return job_id


def fuzz_operation(operation: Any, base_url: str, token: str, known: dict[str, str]) -> list[str]:
    """Valid requests, invalid ones, and valid ones about the ``known`` objects; what the checks found."""
    runs = [(mode.value, operation.as_strategy(generation_mode=mode), EXAMPLES[mode]) for mode in GenerationMode]
    fixed = {p.name: known[p.name] for p in operation.path_parameters if p.name in known}
    if fixed:
        runs.append((str(fixed), operation.as_strategy(path_parameters=fixed), EXAMPLES[GenerationMode.POSITIVE]))
    found = [(label, fuzz(strategy, examples, base_url, token)) for label, strategy, examples in runs]
    return [f"{operation.label} ({label}): {failure}" for label, failure in found if failure is not None]


def fuzz(strategy: Any, examples: int, base_url: str, token: str) -> str | None:
    """Send ``examples`` requests drawn from an operation's strategy; the checks' failures, or None."""

    @settings(max_examples=examples, deadline=None, database=None, derandomize=True,
              phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
    @given(case=strategy)
    def run(case: Any) -> None:
        case.call_and_validate(base_url=base_url, headers={"Authorization": f"Bearer {token}"}, checks=CHECKS,
                               timeout=CALL_TIMEOUT_S)

    try:
        run()
    except Unsatisfiable:  # nothing in the operation can be made invalid (negative mode): nothing to test
        return None
    except (Exception, BaseExceptionGroup) as exc:  # the checks' failures come as a group
        return str(exc)
    return None
