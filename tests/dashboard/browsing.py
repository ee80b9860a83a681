"""Helpers for the dashboard's browser tests: read figures and text out of the page, click,
and tell a client-side update from a page reload."""

from __future__ import annotations

from tests.dashboard.conftest import wait_for

_FIG = "return (function(id){var g=document.querySelector('#'+id+' .js-plotly-plot');" \
       "return g && g.data ? {data: g.data, layout: {title: g.layout.title}} : null;})(arguments[0]);"


def figure(driver, graph_id: str):
    return driver.execute_script(_FIG, graph_id)


def text_of(driver, element_id: str) -> str:
    return driver.execute_script(
        "var e=document.getElementById(arguments[0]); return e ? e.innerText : '';", element_id
    )


def severe_console_errors(driver) -> list[str]:
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"
            and "favicon" not in e["message"]]


def click(driver, by: str, selector: str) -> None:
    """Click an element once the page has rendered it."""
    wait_for(lambda: driver.find_element(by, selector), what=selector).click()


def mark_page(driver) -> None:
    """Set a marker that a full page reload would wipe out."""
    driver.execute_script("window.__moeplane_no_reload = 42;")


def still_same_page(driver) -> bool:
    return driver.execute_script("return window.__moeplane_no_reload === 42;")
