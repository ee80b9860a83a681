"""HEAD, OPTIONS and 405 tell the truth about a REST path (issue 33, item 14): OPTIONS lists
every method of the path, HEAD of a GET path answers like the GET without a body, and a 405's
``Allow`` names all the path's methods, not only the first route's."""

from __future__ import annotations

import httpx
import pytest

from tests.controlplane.serverthread import running_server


@pytest.fixture(scope="module")
def http(tmp_path_factory):
    with (running_server(f"sqlite:///{tmp_path_factory.mktemp('methods') / 'm.sqlite'}") as srv,
          httpx.Client(base_url=f"http://127.0.0.1:{srv['http_port']}/api/v1", timeout=10) as client):
        yield client


def allow(r: httpx.Response) -> set[str]:
    return {m.strip() for m in r.headers["allow"].split(",")}


def test_options_lists_every_method_of_the_path(http):
    r = http.options("/jobs/job-1/policy")
    assert r.status_code == 204 and allow(r) == {"GET", "HEAD", "PUT", "OPTIONS"}
    r = http.options("/jobs")
    assert r.status_code == 204 and allow(r) == {"GET", "HEAD", "OPTIONS"}


def test_head_answers_like_get_without_a_body(http):
    get, head = http.get("/health"), http.head("/health")
    assert head.status_code == get.status_code == 200
    assert head.content == b"" and head.headers["content-type"] == get.headers["content-type"]
    assert http.head("/jobs/nope").status_code == 404


def test_405_names_all_the_methods(http):
    r = http.delete("/jobs/job-1/policy")
    assert r.status_code == 405 and allow(r) == {"GET", "HEAD", "PUT", "OPTIONS"}
    assert http.get("/no-such-path").status_code == 404
