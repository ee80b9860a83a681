"""The dashboard's login gate as ``moeplane serve --auth`` mounts it (issue 33, items 8, 9):
``/dashboard/<page>?token=T`` lands on that page in a real browser (not on
``/dashboard/dashboard/...`` or the cluster page), and under TLS the cookie is ``Secure``."""

from __future__ import annotations

import shutil
import ssl

import httpx
import pytest

from harness.browser import CHROMEDRIVER, CHROMIUM, browser_options
from moeplane.controlplane.auth.tokens import Role, TokenStore
from moeplane.controlplane.procs import wait_until
from tests.auth.test_tls_cli import cert  # noqa: F401 - the self-signed certificate fixture
from tests.conftest import unavailable
from tests.controlplane.serverthread import running_server


@pytest.fixture
def browser(tmp_path):
    if not (shutil.which(CHROMIUM) and shutil.which(CHROMEDRIVER)):
        unavailable("Chromium", f"{CHROMIUM} or {CHROMEDRIVER} not installed")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    try:
        driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=browser_options(str(tmp_path / "profile")))
    except Exception as exc:  # noqa: BLE001 - any launch failure
        unavailable("Chromium", exc)
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()


@pytest.mark.browser
def test_login_link_lands_on_its_page_in_the_browser(tmp_path, browser):
    from selenium.webdriver.common.by import By

    with running_server(f"sqlite:///{tmp_path / 'd.sqlite'}", auth=True, dashboard=True) as srv:
        viewer = TokenStore(srv["engine"]).create(Role.VIEWER).secret
        base = f"http://127.0.0.1:{srv['http_port']}/dashboard/"
        browser.get(f"{base}plans?token={viewer}")
        wait_until(lambda: browser.find_elements(By.ID, "plans-status"), 30, "the plans page",
                   retry_on=(Exception,))
        assert browser.current_url == f"{base}plans"  # the token left the address, the prefix once
        assert not browser.find_elements(By.ID, "cluster-grid")
        browser.get(f"{base}?token={viewer}")
        wait_until(lambda: browser.find_elements(By.ID, "cluster-grid"), 30, "the cluster page",
                   retry_on=(Exception,))
        assert browser.current_url == base


def test_the_cookie_is_secure_under_tls(tmp_path, cert):  # noqa: F811 - the fixture above
    certfile, keyfile = cert
    with running_server(f"sqlite:///{tmp_path / 't.sqlite'}", auth=True, dashboard=True,
                        tls_certfile=str(certfile), tls_keyfile=str(keyfile)) as srv:
        viewer = TokenStore(srv["engine"]).create(Role.VIEWER).secret
        r = httpx.get(f"https://localhost:{srv['http_port']}/dashboard/plans?token={viewer}",
                      verify=ssl.create_default_context(cafile=str(certfile)), timeout=10)
    assert r.status_code == 303 and r.headers["location"] == "/dashboard/plans"
    flags = [f.strip().lower() for f in r.headers["set-cookie"].split(";")]
    assert "secure" in flags and "httponly" in flags
