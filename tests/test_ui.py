"""The web UI's pages in a real headless Chromium (Debian's ``chromium`` and
``chromium-driver``, driven by selenium): each page renders its data after its script ran,
and the buttons work (with their confirmations). ``AWA_SCREENSHOTS=DIR`` also saves a
screenshot of each main page (how docs/screenshots/ is made)."""

from __future__ import annotations

import os
import pathlib
import shutil
from typing import Any, Callable, Iterator

import pytest

import awa
from awa._serve import ServeConfig
from helpers import complete_jobs, fail_jobs
from test_cli import dead, fail_job, insert
from test_serve import Api, start

webdriver = pytest.importorskip("selenium.webdriver")
from selenium.common.exceptions import (  # noqa: E402
    NoAlertPresentException,
    NoSuchElementException,
    StaleElementReferenceException,
    TimeoutException,
)
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

SHOTS = os.environ.get("AWA_SCREENSHOTS")


def _binary(*names: str) -> str | None:
    for name in names:
        found = shutil.which(name)
        if found:
            return found
    return None


@pytest.fixture(scope="module")
def driver() -> Iterator[Any]:
    chromium = _binary("chromium", "chromium-browser")
    chromedriver = _binary("chromedriver")
    if chromium is None or chromedriver is None:
        if os.environ.get("CI"):
            pytest.fail("CI needs chromium and chromium-driver (.ci/run installs them)")
        pytest.skip("chromium / chromedriver not installed (apt-get install -y chromium chromium-driver)")
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--window-size=1280,900"):
        options.add_argument(arg)
    d = webdriver.Chrome(service=Service(chromedriver), options=options)
    d.set_page_load_timeout(60)
    try:
        yield d
    finally:
        d.quit()


@pytest.fixture
def ui(database_url: str) -> Iterator[Api]:
    yield from start(ServeConfig(database_url, port=0))


def wait(driver: Any, predicate: Callable[[Any], Any], what: str, timeout: float = 30) -> Any:
    try:
        # a re-render replaces elements between finding and reading them: look again
        ignored = (StaleElementReferenceException, NoSuchElementException, NoAlertPresentException)
        return WebDriverWait(driver, timeout, poll_frequency=0.05, ignored_exceptions=ignored).until(predicate)
    except TimeoutException:
        errors = driver.find_elements(By.ID, "page-error")
        raise AssertionError(f"timed out waiting for {what}; page error: "
                             f"{errors[0].text if errors else None}; page: {driver.page_source[:2000]}") from None


def loaded(driver: Any, hash_path: str) -> None:
    """Wait until the page's script has rendered route ``hash_path``."""
    wait(driver, lambda d: d.find_element(By.ID, "app").get_attribute("data-loaded") == hash_path, f"page {hash_path}")


def open_page(driver: Any, api: Api, hash_path: str, _unused: str = "") -> None:
    """Open ``#hash_path`` and wait until the script rendered it."""
    driver.get("about:blank")  # a fresh load, not just a hash change of the page already open
    driver.get(api.base + "/?refresh=0#" + hash_path)  # no auto-refresh: the DOM stays put
    loaded(driver, hash_path)


def text(driver: Any, css: str) -> str:
    return str(driver.find_element(By.CSS_SELECTOR, css).text)


def click(driver: Any, css: str, confirm: bool | None = None) -> None:
    driver.find_element(By.CSS_SELECTOR, css).click()
    if confirm is not None:
        alert = wait(driver, lambda d: d.switch_to.alert, "the confirmation")
        alert.accept() if confirm else alert.dismiss()


def flash_says(driver: Any, words: str) -> None:
    wait(driver, lambda d: words in d.find_element(By.ID, "flash").text, f"flash {words!r}")


def shot(driver: Any, name: str) -> None:
    if SHOTS:
        pathlib.Path(SHOTS).mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(pathlib.Path(SHOTS) / f"{name}.png"))


def test_dashboard_renders_counts_chart_queues_failures(driver: Any, ui: Api, sync_client: awa.Client) -> None:
    broken = insert(sync_client, 1, queue="mail", kind="send_email")[0]
    fail_job(sync_client, broken, "SMTP said 550")
    insert(sync_client, 3, queue="mail", kind="send_email")
    done = insert(sync_client, 2, queue="reports", kind="nightly_report")
    sync_client._run(complete_jobs(sync_client._async, done))
    open_page(driver, ui, "/", "/")
    assert text(driver, '.card[data-state="available"] .n') == "3"
    assert text(driver, '.card[data-state="failed"] .n') == "1"
    assert text(driver, '.card[data-state="completed"] .n') == "2"
    assert driver.find_elements(By.CSS_SELECTOR, "#throughput path.c-completed")
    assert "completed: 2" in text(driver, ".legend")
    assert [e.text for e in driver.find_elements(By.CSS_SELECTOR, "table.queues tbody tr td:first-child a")] == ["mail", "reports"]
    assert "SMTP said 550" in text(driver, "table.jobs")
    shot(driver, "dashboard")


def test_jobs_page_filters_paging_and_bulk_actions(driver: Any, ui: Api, sync_client: awa.Client) -> None:
    ids = insert(sync_client, 60, queue="mail")
    open_page(driver, ui, "/jobs", "/jobs")
    rows = driver.find_elements(By.CSS_SELECTOR, "table.jobs tbody tr")
    assert len(rows) == 50 and rows[0].get_attribute("data-id") == str(ids[-1])
    click(driver, "#next-page")
    loaded(driver, f"/jobs?before_id={ids[10]}")
    assert len(driver.find_elements(By.CSS_SELECTOR, "table.jobs tbody tr")) == 10
    # filters go into the URL
    open_page(driver, ui, "/jobs", "/jobs")
    driver.find_element(By.CSS_SELECTOR, "#job-filters select[name=state]").send_keys("available")
    driver.find_element(By.CSS_SELECTOR, "#job-filters input[name=queue]").send_keys("mail")
    click(driver, "#job-filters button[type=submit]")
    loaded(driver, "/jobs?state=available&queue=mail")  # the filters are in the URL
    shot(driver, "jobs")
    # bulk cancel two jobs: dismissing the confirmation does nothing, accepting cancels them
    for job_id in ids[-2:]:
        click(driver, f'input.pick[data-id="{job_id}"]')
    click(driver, '[data-action="bulk-cancel"]', confirm=False)
    assert ui.get(f"/api/jobs/{ids[-1]}")["state"] == "available"
    click(driver, '[data-action="bulk-cancel"]', confirm=True)
    flash_says(driver, "Cancelled 2 jobs")
    assert {ui.get(f"/api/jobs/{i}")["state"] for i in ids[-2:]} == {"cancelled"}
    open_page(driver, ui, "/jobs?state=cancelled")
    for job_id in ids[-2:]:
        click(driver, f'input.pick[data-id="{job_id}"]')
    click(driver, '[data-action="bulk-retry"]', confirm=True)
    flash_says(driver, "Retried 2 jobs")
    assert {ui.get(f"/api/jobs/{i}")["state"] for i in ids[-2:]} == {"available"}


def test_job_detail_shows_args_errors_progress_and_acts(driver: Any, ui: Api, sync_client: awa.Client) -> None:
    job_id = sync_client.insert({"to": "ada@example.com"}, kind="send_email", metadata={"tenant": "t1"}).id
    sync_client._run(fail_jobs(sync_client._async, [job_id], "SMTP said 550", progress=(40, "half way")))
    open_page(driver, ui, f"/jobs/{job_id}", f"/jobs/{job_id}")
    assert "ada@example.com" in text(driver, "#job-args")
    assert "tenant" in text(driver, "#job-metadata")
    assert "half way" in text(driver, "#job-progress")
    assert "SMTP said 550" in text(driver, "#attempts")
    driver.find_element(By.CSS_SELECTOR, "#attempts details summary").click()
    assert "Traceback" in text(driver, "#attempts pre.traceback")
    shot(driver, "job")
    click(driver, '[data-action="retry"]')
    flash_says(driver, f"Job {job_id} retried")
    assert ui.get(f"/api/jobs/{job_id}")["state"] == "available"
    click(driver, '[data-action="cancel"]', confirm=True)
    flash_says(driver, f"Job {job_id} cancelled")
    assert ui.get(f"/api/jobs/{job_id}")["state"] == "cancelled"


def test_queues_page_pause_resume_drain(driver: Any, ui: Api, sync_client: awa.Client) -> None:
    insert(sync_client, 4, queue="mail")
    open_page(driver, ui, "/queues", "/queues")
    row = 'tr[data-queue="mail"]'
    assert text(driver, f"{row} td.num") == "4"
    shot(driver, "queues")
    click(driver, f'{row} [data-action="pause"]')
    flash_says(driver, "Queue mail paused")
    assert ui.get("/api/queues/mail")["paused"] is True
    assert "paused" in text(driver, row)
    click(driver, f'{row} [data-action="resume"]')
    flash_says(driver, "Queue mail resumed")
    click(driver, f'{row} [data-action="drain"]', confirm=True)
    flash_says(driver, "4 jobs cancelled")
    assert ui.get("/api/queues/mail")["counts"]["cancelled"] == 4


def test_cron_page_trigger_pause_resume(driver: Any, ui: Api, sync_client: awa.Client) -> None:
    sync_client._run(sync_client._async._execute(
        "INSERT INTO awa.cron_jobs (name, cron_expr, timezone, kind, queue, args) "
        "VALUES ('nightly', '0 3 * * *', 'UTC', 'nightly_report', 'reports', '{}')"))
    open_page(driver, ui, "/cron", "/cron")
    assert "0 3 * * *" in text(driver, 'tr[data-name="nightly"]')
    shot(driver, "cron")
    click(driver, '[data-action="trigger"]')
    flash_says(driver, "Enqueued job")
    assert ui.get("/api/jobs?kind=nightly_report")["jobs"]
    click(driver, '[data-action="cron-pause"]')
    flash_says(driver, "Schedule nightly paused")
    assert ui.get("/api/cron")[0]["paused"] is True
    click(driver, '[data-action="cron-resume"]')
    flash_says(driver, "Schedule nightly resumed")


def test_dlq_page_retry_delete_purge(driver: Any, ui: Api, sync_client: awa.Client) -> None:
    import asyncio

    ids = dead(sync_client, 4, kind="send_email", queue="mail")

    async def move() -> None:
        native = awa._awa.NativeClient(sync_client._async.database_url, 1)
        await awa._awa.dlq_move(native, ids, "exhausted retries")
        await native.close()

    asyncio.run(move())
    open_page(driver, ui, "/dlq", "/dlq")
    assert text(driver, "#dlq-total") == "4"
    assert len(driver.find_elements(By.CSS_SELECTOR, "table.dlq tbody tr")) == 4
    shot(driver, "dlq")
    click(driver, f'tr[data-id="{ids[0]}"] [data-action="dlq-retry"]')
    flash_says(driver, f"DLQ job {ids[0]} retried")
    click(driver, f'tr[data-id="{ids[1]}"] [data-action="dlq-delete"]', confirm=True)
    flash_says(driver, f"DLQ job {ids[1]} deleted")
    click(driver, '[data-action="dlq-bulk-purge"]', confirm=True)
    flash_says(driver, "Purged 2 DLQ jobs")
    assert ui.get("/api/dlq/depth")["total"] == 0


def test_runtime_page(driver: Any, ui: Api) -> None:
    open_page(driver, ui, "/runtime", "/runtime")
    assert "No maintenance leader" in text(driver, "#leader")
    assert f"Schema version {awa._awa.SCHEMA_VERSION}" in text(driver, "main")
    shot(driver, "runtime")


def test_pages_refresh_themselves(driver: Any, ui: Api, sync_client: awa.Client) -> None:
    driver.get(ui.base + "/?refresh=0.2#/")
    loaded(driver, "/")
    assert text(driver, '.card[data-state="available"] .n') == "0"
    insert(sync_client, 2)
    wait(driver, lambda d: d.find_element(By.CSS_SELECTOR, '.card[data-state="available"] .n').text == "2",
         "the refreshed count")


def test_queues_and_kinds_pages_show_descriptors(driver: Any, ui: Api, sync_client: awa.Client) -> None:
    insert(sync_client, 1, queue="mail", kind="send")
    run = sync_client._async._execute
    sync_client._run(run(
        "INSERT INTO awa.queue_descriptors (queue, display_name, description, owner, docs_url, tags, "
        "descriptor_hash) VALUES ('mail', 'Outbound mail', 'Sends receipts.', 'growth@example.com', "
        "'https://runbook.example.com/mail', '{user-facing}', 'h')"))
    sync_client._run(run(
        "INSERT INTO awa.job_kind_descriptors (kind, display_name, docs_url, descriptor_hash) "
        "VALUES ('send', 'Send one mail', 'javascript:alert(1)', 'h')"))
    open_page(driver, ui, "/queues", "/queues")
    row = 'tr[data-queue="mail"]'
    assert text(driver, f"{row} .display-name") == "Outbound mail"
    assert "Sends receipts." in text(driver, row) and "owner: growth@example.com" in text(driver, row)
    assert text(driver, f"{row} .tag") == "user-facing"
    link = driver.find_element(By.CSS_SELECTOR, f"{row} a.docs")
    assert link.get_attribute("href") == "https://runbook.example.com/mail"
    open_page(driver, ui, "/kinds", "/kinds")
    kind = 'tr[data-kind="send"]'
    assert text(driver, f"{kind} .display-name") == "Send one mail"
    assert driver.find_elements(By.CSS_SELECTOR, f"{kind} a.docs") == []  # not an http(s) URL


def test_read_only_hides_every_button(driver: Any, database_url: str, sync_client: awa.Client) -> None:
    job_id = insert(sync_client, 1, queue="mail")[0]
    fail_job(sync_client, job_id)
    for api in start(ServeConfig(database_url, port=0, read_only=True)):
        for path, loaded in (("/", "/"), ("/jobs", "/jobs"), (f"/jobs/{job_id}", f"/jobs/{job_id}"),
                             ("/queues", "/queues"), ("/dlq", "/dlq"), ("/cron", "/cron")):
            open_page(driver, api, path, loaded)
            assert text(driver, "#read-only") == "read-only"
            assert driver.find_elements(By.CSS_SELECTOR, "[data-action], input.pick") == [], path


def test_auth_token_prompt(driver: Any, database_url: str) -> None:
    for api in start(ServeConfig(database_url, port=0, auth_token="s3cret")):
        driver.get(api.base + "/#/")
        wait(driver, lambda d: d.find_elements(By.ID, "token-form"), "the token prompt")
        driver.find_element(By.NAME, "token").send_keys("s3cret")
        click(driver, "#token-form button")
        loaded(driver, "/")
        driver.execute_script("sessionStorage.clear()")
