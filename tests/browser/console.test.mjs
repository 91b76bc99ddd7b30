// The web console in a real browser: Debian's chromium, headless, driven by playwright-core,
// against a gateway this test starts (target/debug/wsr-gateway, as the last `cargo test`
// built it) with real traffic: an inbound message, an outbound message in doubt (its
// destination, a local server, answers 503), and a dead letter. Screenshots of the main pages:
// CONSOLE_SCREENSHOTS=../../docs. Run: `npm ci && npm test` here (.ci/run does).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync, existsSync } from 'node:fs';
import { createServer } from 'node:http';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { chromium } from 'playwright-core';

const root = resolve(import.meta.dirname, '../..');
const binary = process.env.WSR_GATEWAY_BIN ?? join(root, 'target/debug/wsr-gateway');
const ADMIN = 'browser-admin-token-0123456789';
const PRODUCER = 'browser-produce-token-0123456789';
const CONSUMER = 'browser-consume-token-0123456789';
const GROUP = 'mid:example-po-0001@partner.example.org';

/** A local HTTP server answering 503 to everything: the outbound message's destination. */
function unavailableServer() {
  return new Promise((ok) => {
    const server = createServer((req, res) => {
      req.resume();
      req.on('end', () => {
        res.writeHead(503, { 'content-type': 'text/plain' });
        res.end('down for the test\n');
      });
    });
    server.listen(0, '127.0.0.1', () => ok(server));
  });
}

function freePort() {
  return new Promise((ok, fail) => {
    const s = createServer();
    s.on('error', fail);
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => ok(port));
    });
  });
}

/** Asks `probe` every 100 ms until it returns something truthy, for at most `ms`. */
async function eventually(what, probe, ms = 15000) {
  const until = Date.now() + ms;
  for (;;) {
    const found = await probe().catch(() => undefined);
    if (found) return found;
    if (Date.now() > until) throw new Error(`${what}: not within ${ms} ms`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

test('the console over real traffic: log in, inspect, resend, fail, replay, log out', { timeout: 110000 }, async () => {
  assert.ok(existsSync(binary), `${binary} is missing: run cargo test (or cargo build) first`);
  const work = mkdtempSync(join(tmpdir(), 'wsr-console-'));
  const sink = await unavailableServer();
  const sinkPort = sink.address().port;
  const port = await freePort();
  const base = `http://127.0.0.1:${port}`;
  writeFileSync(join(work, 'gateway.toml'), `
listen = "127.0.0.1:${port}"
database = "${join(work, 'gw.db')}"
durability = "os"
allow_url_destinations = true
allowed_destination_hosts = ["127.0.0.1:${sinkPort}"]

[[tokens]]
token = "${ADMIN}"
principal = "ops"
scopes = ["admin"]

[[tokens]]
token = "${PRODUCER}"
principal = "app"
scopes = ["produce"]

[[tokens]]
token = "${CONSUMER}"
principal = "billing"
scopes = ["consume"]
`);
  const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith('WSR_')));
  const gateway = spawn(binary, ['serve', '--config', join(work, 'gateway.toml')], {
    env: { ...env, RUST_LOG: 'warn' },
    stdio: ['ignore', 'ignore', 'pipe'],
  });
  let gatewayLog = '';
  gateway.stderr.on('data', (d) => { gatewayLog += d; });
  let context;
  try {
    await eventually('the gateway answers /healthz', async () => (await fetch(`${base}/healthz`)).ok);

    // An inbound message: the example, expiring in an hour (as README "Run it").
    const inAnHour = new Date(Date.now() + 3600_000).toISOString().replace(/\.\d+Z$/, 'Z');
    const xml = readFileSync(join(root, 'examples/purchase-order.xml'), 'utf8')
      .replace('2099-12-31T23:59:59Z', inAnHour);
    const received = await fetch(`${base}/wsr/default`, {
      method: 'POST', headers: { 'content-type': 'text/xml; charset=utf-8' }, body: xml,
    });
    assert.equal(received.status, 200, await received.text());

    const api = async (token, method, path, body) => {
      const r = await fetch(`${base}/api/v1${path}`, {
        method,
        headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
        body: body === undefined ? undefined : JSON.stringify(body),
      });
      const text = await r.text();
      assert.ok(r.ok, `${method} ${path}: ${r.status} ${text}`);
      return text ? JSON.parse(text) : {};
    };

    // An outbound message whose one attempt gets a 503: it stays sent, in doubt.
    const submitted = await api(PRODUCER, 'POST', '/messages', {
      destination: `http://127.0.0.1:${sinkPort}/wsr`,
      agreement: { max_attempts: 1, interval_ms: 100, backoff: 1, expiry_seconds: 3600 },
      body: '<t:Order xmlns:t="urn:example:t">42</t:Order>',
    });
    const messageId = submitted.id;
    await eventually('the first attempt went out', async () =>
      (await api(PRODUCER, 'GET', `/messages/${encodeURIComponent(messageId)}`)).attempts >= 1);

    // A dead letter: one delivery allowed, and it is rejected.
    const sub = await api(CONSUMER, 'POST', '/subscriptions', {
      name: 'audit', filter: 'default/#', max_deliveries: 1, start: 'oldest',
    });
    const session = await api(CONSUMER, 'POST', `/subscriptions/${sub.id}/sessions`, {});
    const fetched = await api(CONSUMER, 'POST', `/sessions/${session.session}/fetch`, { max: 1, wait_ms: 5000 });
    assert.equal(fetched.messages.length, 1, JSON.stringify(fetched));
    await api(CONSUMER, 'POST', '/settle', { receipt: fetched.messages[0].receipt, outcome: 'rejected' });

    context = await chromium.launchPersistentContext(join(work, 'chromium-profile'), {
      executablePath: '/usr/bin/chromium',
      headless: true,
      args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
        '--disable-background-networking', '--disable-component-update', '--disable-sync'],
      viewport: { width: 1100, height: 760 },
    });
    context.setDefaultTimeout(10000);
    const page = context.pages()[0] ?? await context.newPage();
    // Screenshots go to the work folder, or to CONSOLE_SCREENSHOTS (the README's are taken
    // with CONSOLE_SCREENSHOTS=../../docs), so that a test run leaves the checkout as it was.
    const shots = process.env.CONSOLE_SCREENSHOTS ? resolve(process.env.CONSOLE_SCREENSHOTS) : work;
    const shot = (name) => page.screenshot({ path: join(shots, `console-${name}.png`) });
    const heading = () => page.locator('h1').innerText();
    const fact = (name) => page.locator(`tr:has(th:text-is("${name}")) td`).first().innerText();

    // Log in: a wrong token is refused, the admin token lands on the overview.
    await page.goto(`${base}/console`);
    assert.equal(await heading(), 'Log in');
    await page.getByLabel('Admin token').fill('not-the-token-0123456789');
    await page.getByRole('button', { name: 'Log in' }).click();
    await page.getByText('unknown token').waitFor();
    await page.getByLabel('Admin token').fill(ADMIN);
    await page.getByRole('button', { name: 'Log in' }).click();
    assert.equal(await heading(), 'Overview');
    await page.getByRole('rowheader', { name: 'audit' }).waitFor();
    // Our messages to URL destinations: Queued, Sent, In doubt, Failed, Faulted, Acked.
    const sending = (column) =>
      page.locator('tr:has(th:text-is("anonymous")) td').nth(column).innerText();
    assert.equal(await sending(2), '1', 'one message in doubt');
    assert.equal(await sending(3), '0', 'none failed yet');
    const receiving = page.locator('tr:has(th:has(a:text-is("default"))) td');
    assert.equal(await receiving.nth(0).innerText(), 'anonymous');
    assert.equal(await receiving.nth(1).innerText(), '1', 'received in the last minute');
    await shot('overview');

    // The inbound message: its group by search, then its payload from the inbox.
    await page.getByRole('link', { name: 'Inbound groups' }).click();
    await page.getByLabel('Group id').fill(GROUP);
    await page.getByRole('button', { name: 'Find' }).click();
    assert.equal(await heading(), `Group ${GROUP}`);
    assert.equal(await fact('Delivered'), '0');
    // The inbox searched: nothing from a partner that sent nothing, the message by channel.
    await page.getByRole('link', { name: 'Inbox' }).click();
    await page.getByLabel('Partner').fill('acme');
    await page.getByRole('button', { name: 'Search' }).click();
    await page.getByText('Delivered messages: none.').waitFor();
    await page.getByLabel('Partner').fill('anonymous');
    await page.getByLabel('Channel').fill('default');
    await page.getByRole('button', { name: 'Search' }).click();
    await page.getByRole('link', { name: '1', exact: true }).click();
    assert.equal(await heading(), 'Inbox message 1');
    assert.match(await page.locator('pre').innerText(), /<po:PurchaseOrder/);
    await shot('inbound');

    // The outbound message: found by the in-doubt filter, its attempts with the partner's
    // 503, then resent (attempts move) and failed (with a reason and the confirmation).
    await page.getByRole('link', { name: 'Outbound' }).click();
    await page.getByLabel('State').selectOption('in_doubt');
    await page.getByRole('button', { name: 'Filter' }).click();
    await page.getByRole('link', { name: messageId }).click();
    assert.equal(await fact('state'), 'in doubt');
    assert.match(await fact('last_error'), /HTTP 503/);
    const attempt = page.locator('table:has(caption:text-matches("Attempts and polls")) tr').nth(1);
    assert.match(await attempt.innerText(), /send[\s\S]*503[\s\S]*none[\s\S]*HTTP 503/);
    const attemptsBefore = Number(await fact('attempts'));
    assert.ok(attemptsBefore >= 1);
    await shot('message');
    await page.getByRole('button', { name: 'Resend now' }).click();
    await page.getByText('Resend ordered').waitFor();
    await eventually('the resend is counted', async () => {
      await page.reload();
      return Number(await fact('attempts')) > attemptsBefore;
    });
    await page.getByLabel('Reason').fill('partner down for maintenance');
    await page.getByLabel(/Failing it is final/).check();
    await page.getByRole('button', { name: 'Fail' }).click();
    await page.getByText('The message was failed.').waitFor();
    assert.equal(await fact('state'), 'failed');
    assert.match(await fact('reason'), /failed by operator ops: partner down for maintenance/);
    // The overview's counts follow: no longer in doubt, failed; its rates chart is there.
    await page.getByRole('link', { name: 'Overview' }).click();
    assert.equal(await sending(2), '0', 'none in doubt');
    assert.equal(await sending(3), '1', 'one failed');
    assert.equal(await page.locator('svg.chart polyline').count(), 6, 'a line per rate');

    // Send again: the failed message, found by its count, becomes a new message.
    await page.locator('tr:has(th:text-is("anonymous")) td').nth(3).getByRole('link').click();
    await page.getByRole('link', { name: messageId }).click();
    await page.getByRole('button', { name: 'Send again' }).click();
    await page.getByText('Sent again: this is the new message').waitFor();
    const newId = (await heading()).replace('Outbound message ', '');
    assert.notEqual(newId, messageId);
    assert.match(await fact('submitted_at'), /^\d{4}-/);

    // The partners view: the URL destination's failures, under the one name for no partner.
    await page.getByRole('link', { name: 'Partners' }).click();
    assert.equal(await heading(), 'Partners');
    await eventually('the failed attempt is the partner view\'s last error', async () => {
      await page.reload();
      const row = page.locator('tr:has(th:text-is("anonymous"))');
      return /HTTP 503/.test(await row.innerText());
    });
    await shot('partners');

    // The dead letter: replay it, and the count goes to 0.
    await page.getByRole('link', { name: 'Subscriptions' }).click();
    assert.equal(await page.locator('tr:has(a:text-is("audit")) td').nth(6).innerText(), '1', 'one dead letter');
    await page.getByRole('link', { name: 'audit', exact: true }).click();
    assert.equal(await fact('Dead letters'), '1');
    await shot('subscription');
    await page.getByRole('button', { name: 'Replay all dead letters' }).click();
    await page.getByText('1 dead letter(s) replayed.').waitFor();
    assert.equal(await fact('Dead letters'), '0');

    // The audit trail: the sign-in, the fail, the send again and the replay above, by the
    // console's operator, each with its result.
    await page.getByRole('link', { name: 'Audit', exact: true }).click();
    assert.equal(await heading(), 'Audit trail');
    const trail = await page.locator('table').innerText();
    assert.match(trail, /ops\s+send_again[^\n]*\sdone/);
    assert.match(trail, /ops\s+fail\s+[^\n]*partner down for maintenance/);
    assert.match(trail, /ops\s+replay_dead_letters\s+subscription \d+/);
    assert.match(trail, /ops\s+console_sign_in\s+console[^\n]*\sdone/);

    // Log out: the console asks for the token again.
    await page.getByRole('button', { name: 'Log out' }).click();
    assert.equal(await heading(), 'Log in');
    await page.goto(`${base}/console/messages`);
    assert.equal(await heading(), 'Log in');
  } catch (e) {
    e.message += `\n--- gateway log ---\n${gatewayLog.slice(-4000)}`;
    throw e;
  } finally {
    await context?.close().catch(() => {});
    gateway.kill('SIGTERM');
    const exited = new Promise((r) => gateway.once('exit', r));
    const late = setTimeout(() => gateway.kill('SIGKILL'), 5000);
    if (gateway.exitCode === null && gateway.signalCode === null) await exited;
    clearTimeout(late);
    await new Promise((r) => sink.close(r));
    rmSync(work, { recursive: true, force: true });
  }
});
