"""The one job-mix reader: text in, a `JobMix` or one error naming the source and field."""

import json

import pytest

from flexmodel.errors import FlexModelError, InvalidJobError
from flexmodel.jobmix import parse_job_mix, parse_job_mix_json

JOB = {"id": "a", "gpus": 8, "power_w": 600.0, "throughput": 20000.0, "pfi": 1.5}


def test_text_gives_the_mix_the_decoded_document_gives():
    doc = {"overhead_factor": 1.3, "jobs": [JOB]}
    assert parse_job_mix_json(json.dumps(doc), source="site.json") == parse_job_mix(doc)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"jobs": [', "site.json: invalid JSON at line 1 column 11"),
        ('{"jobs": [], "overhead_factor": NaN}', "site.json: NaN is not a number JSON allows"),
        ('{"jobs": [], "static_load_kw": Infinity}', "site.json: Infinity is not a number"),
        ('{"jobs": [], "static_load_kw": -Infinity}', "site.json: -Infinity is not a number"),
    ],
)
def test_text_that_is_not_json_is_refused_naming_the_source(text, message):
    with pytest.raises(FlexModelError, match=message):
        parse_job_mix_json(text, source="site.json")


def test_a_bad_field_is_named_after_the_source():
    doc = {"jobs": [{**JOB, "gpus": 0}]}
    with pytest.raises(InvalidJobError, match=r"^site.json: job 'a': 'gpus' must be a whole"):
        parse_job_mix_json(json.dumps(doc), source="site.json")
