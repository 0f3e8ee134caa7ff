"""The JSON a job's reads answer with, as models for the OpenAPI document.

The routes return service/jobs.py's dicts as they are; these models only declare their shape (a route names
one in ``responses``, not as its ``response_model``, so a field added to the view is not dropped on the way
out). tests/test_api_schema.py checks real answers against them.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


class JobStage(BaseModel):
    stage: str
    item_key: str
    status: str = Field(description="queued, running, succeeded, failed, dead_lettered, awaiting_review, ...")
    attempts: int
    cached: bool = Field(description="answered from the memo of an earlier identical call of the same tenant")
    error_class: str | None


class JobError(BaseModel):
    stage: str
    item_key: str
    error_class: str | None
    error: str | None = Field(description="the first line of the last error")


class JobReview(BaseModel):
    review_id: int
    stage: str
    item_key: str
    reason_class: str | None
    reason: str | None


class PublishedRecord(BaseModel):
    collection: str
    version: int
    fields: dict[str, Any] | None


class JobView(BaseModel):
    """``GET /v1/jobs/{job_id}``."""

    job_id: str
    kind: str
    pipeline: str
    lane: str
    key: str | None = Field(description="the document's item key, the tenant's own (names its publication)")
    status: str = Field(description="queued, running, awaiting_review, or the job's end: published, completed, "
                                    "failed, dead_lettered, rejected")
    outcome: str | None = Field(description="the job's end, once it ended")
    created_at: float = Field(description="seconds since the epoch")
    finished_at: float | None
    metadata: dict[str, Any] | None
    webhook_url: str | None
    stages: list[JobStage] = Field(description="the job's tasks, at most 200")
    errors: list[JobError]
    tasks_truncated: bool = Field(description="the job has more tasks than ``stages`` lists")
    reviews: list[JobReview] = Field(description="answers of the job waiting for a person's decision")
    record: PublishedRecord | None = Field(description="the document's live published record")
    output: Any = Field(description="the output of the last stage that succeeded on the document")


class JobSummary(BaseModel):
    job_id: str
    kind: str
    pipeline: str
    key: str | None
    lane: str
    created_at: float
    finished_at: float | None
    outcome: str | None


class JobList(BaseModel):
    """``GET /v1/jobs``."""

    jobs: list[JobSummary]
    next_before: float | None = Field(description="pass as ``before`` for the next page; null on the last one")
