"""The inbox's HTML: every page rendered on the server, every value escaped.

Pure functions from what the desk returned to a page; no request, no store. The
one script (``SCRIPT``) only counts ages and times left down in the browser; every
page works without it.
"""

from __future__ import annotations

import datetime as dt
import json
import time
import urllib.parse
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from html import escape
from typing import Any

from cleveragents.approvals.model import EXPIRED, WAITING, Decision, Parked

__all__ = [
    "AUDIT_EVENTS",
    "SCRIPT",
    "STYLE",
    "Page",
    "audit_page",
    "call_page",
    "call_path",
    "inbox_page",
    "login_page",
    "message_page",
]

#: The audit trail's events, in the order of a call's life (docs/approvals.md).
AUDIT_EVENTS = (
    "requested", "refused", "awaiting_approval", "approved", "rejected", "expired",
    "started", "succeeded", "failed",
)
#: An argument whose pretty text is longer than this (or spans more lines) is folded.
FOLD_CHARS = 240
FOLD_LINES = 8


@dataclass(frozen=True)
class Page:
    """What every page shares: who is signed in, the CSRF token for its forms."""

    csrf: str
    #: The signed-in person's name ('' when nobody signs in: loopback without a token).
    name: str = ""
    #: Whether a token guards the inbox (then a decision's ``by`` is the session's name).
    token: bool = False


def call_path(request_id: str) -> str:
    """A call's page."""
    return f"/calls/{urllib.parse.quote(request_id, safe='')}"


def _iso(seconds: float) -> str:
    return dt.datetime.fromtimestamp(seconds, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _span(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    if seconds < 172800:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 86400:.1f}d"


def _age(at: float, now: float) -> str:
    return f'<span class="age" data-since="{at:.3f}">{_span(now - at)}</span>'


def _left(until: float, now: float) -> str:
    return f'<span class="left" data-until="{until:.3f}">{_span(until - now)}</span>'


def _csrf(page: Page) -> str:
    return f'<input type="hidden" name="csrf" value="{escape(page.csrf)}">'


def _layout(title: str, body: str, page: Page | None) -> str:
    nav = ""
    if page is not None:
        who = ""
        if page.name:
            who = (
                f'<span class="who">signed in as {escape(page.name)}</span>'
                f'<form method="post" action="/logout" class="inline">{_csrf(page)}'
                '<button type="submit" class="link">Sign out</button></form>'
            )
        nav = (
            '<nav><a href="/">Waiting calls</a> <a href="/audit">Audit trail</a>'
            f"{who}</nav>"
        )
    return (
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{escape(title)} · cleveragents approvals</title>"
        '<link rel="stylesheet" href="/static/inbox.css">'
        '<script src="/static/inbox.js" defer></script></head>'
        f"<body>{nav}<main>{body}</main></body></html>\n"
    )


def message_page(title: str, text: str, page: Page | None = None) -> str:
    """A page that says one thing (an unknown call, a refused form)."""
    return _layout(title, f"<h1>{escape(title)}</h1><p class=\"message\">{escape(text)}</p>"
                   '<p><a href="/">Back to the waiting calls</a></p>', page)


def login_page(csrf: str, *, next_path: str = "/", error: str | None = None) -> str:
    """The login form: the token (a password field) and the person's name."""
    said = f'<p class="error" role="alert">{escape(error)}</p>' if error else ""
    body = (
        "<h1>Approvals: sign in</h1>"
        f"{said}"
        '<form method="post" action="/login" class="login">'
        f'<input type="hidden" name="csrf" value="{escape(csrf)}">'
        f'<input type="hidden" name="next" value="{escape(next_path)}">'
        '<label>Your name <input type="text" name="name" required maxlength="200" '
        'autocomplete="name"></label>'
        '<label>Inbox token <input type="password" name="token" required '
        'autocomplete="current-password"></label>'
        '<button type="submit">Sign in</button></form>'
        "<p>Your name is recorded with every call you approve or reject.</p>"
    )
    return _layout("Sign in", body, None)


def inbox_page(waiting: Iterable[Parked], page: Page, now: float | None = None) -> str:
    """``/``: the calls that wait, oldest first."""
    now = time.time() if now is None else now
    rows = []
    for record in waiting:
        rows.append(
            "<tr>"
            f'<td><a href="{escape(call_path(record.request_id))}">'
            f"{escape(record.request_id)}</a></td>"
            f"<td>{escape(record.skill)}</td><td>{escape(record.tool)}</td>"
            f"<td>{_age(record.asked_at, now)}</td>"
            f"<td>{escape(record.asked_by or 'unknown')}</td>"
            f"<td>{_left(record.expires_at, now)}</td>"
            "</tr>"
        )
    if rows:
        table = (
            '<table class="calls"><thead><tr><th>request id</th><th>skill</th><th>tool</th>'
            "<th>waiting for</th><th>asked by</th><th>time left</th></tr></thead>"
            f"<tbody>{''.join(rows)}</tbody></table>"
        )
    else:
        table = '<p class="empty">No call waits for approval.</p>'
    count = len(rows)
    heading = f"{count} call{'s' if count != 1 else ''} waiting for approval"
    body = f'<h1 data-refresh="30">{heading}</h1>{table}'
    return _layout("Waiting calls", body, page)


def _folded(text: str) -> str:
    if len(text) <= FOLD_CHARS and text.count("\n") < FOLD_LINES:
        return f"<pre>{escape(text)}</pre>"
    first = text.splitlines()[0] if "\n" in text else text
    preview = first[:80] + ("…" if len(first) > 80 or "\n" in text else "")
    return (
        f"<details><summary><code>{escape(preview)}</code> "
        f'<span class="size">({len(text):,} characters: show all)</span></summary>'
        f"<pre>{escape(text)}</pre></details>"
    )


def _pretty(value: Any) -> str:
    if isinstance(value, str):
        return value  # a string as it is, not JSON-quoted: what the tool will read
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True)


def _arguments(arguments: Any) -> str:
    if not isinstance(arguments, Mapping) or not arguments:
        return _folded(_pretty(arguments if arguments is not None else {}))
    rows = "".join(
        f'<tr><th scope="row">{escape(str(key))}</th><td>{_folded(_pretty(value))}</td></tr>'
        for key, value in arguments.items()
    )
    return f'<table class="arguments">{rows}</table>'


def _events(events: Iterable[Mapping[str, str]], *, with_call: bool) -> str:
    rows = []
    for event in events:
        extra = " ".join(
            f"{key}={event[key]}" for key in ("by", "reason", "gate", "error_type") if key in event
        )
        call = ""
        if with_call:
            rid = event.get("request_id", "")
            call = (f'<td><a href="{escape(call_path(rid))}">{escape(rid)}</a></td>'
                    f"<td>{escape(event.get('skill', ''))} / {escape(event.get('tool', ''))}</td>")
        rows.append(
            f"<tr><td>{escape(event.get('at', ''))}</td><td>{escape(event.get('event', ''))}</td>"
            f"{call}<td>{escape(extra)}</td></tr>"
        )
    if not rows:
        return '<p class="empty">No audit events.</p>'
    head = "<th>request id</th><th>skill / tool</th>" if with_call else ""
    return (
        f'<table class="events"><thead><tr><th>at</th><th>event</th>{head}<th>details</th>'
        f"</tr></thead><tbody>{''.join(rows)}</tbody></table>"
    )


def _status(record: Parked, decision: Decision | None, now: float) -> tuple[str, bool]:
    """What became of the call, in words, and whether it still waits for a decision."""
    if decision is not None:
        why = f": “{decision.reason}”" if decision.reason else ""
        after = "it runs (or ran) once" if decision.outcome == "approved" else "it will not run"
        return (f"{decision.outcome.capitalize()} by {decision.by} at {_iso(decision.at)}{why}; "
                f"{after}."), False
    if record.state == EXPIRED or (record.state == WAITING and now >= record.expires_at):
        return (f"Expired undecided at {_iso(record.expires_at)}: it did not run. Send it again "
                "under a new request id to ask again."), False
    if record.state != WAITING:
        return f"This call is {record.state}.", False
    return (f"Waiting for a decision: {_left(record.expires_at, now)} left "
            f"(until {_iso(record.expires_at)})."), True


def call_page(
    record: Parked,
    decision: Decision | None,
    events: Iterable[Mapping[str, str]],
    page: Page,
    digest: str,
    *,
    error: str | None = None,
    now: float | None = None,
) -> str:
    """A call's page: what it asks, the forms while it waits, its audit events."""
    now = time.time() if now is None else now
    status, open_ = _status(record, decision, now)
    said = f'<p class="error" role="alert">{escape(error)}</p>' if error else ""
    facts = (
        '<dl class="facts">'
        f"<dt>skill</dt><dd>{escape(record.skill)}</dd>"
        f"<dt>tool</dt><dd>{escape(record.tool)}</dd>"
        f"<dt>asked by</dt><dd>{escape(record.asked_by or 'unknown')}</dd>"
        f"<dt>asked</dt><dd>{_iso(record.asked_at)} ({_age(record.asked_at, now)} ago)</dd>"
        f"<dt>writes allowed</dt><dd>{'yes' if record.body.get('allow_writes') else 'no'}</dd>"
        f"<dt>digest</dt><dd><code>{escape(digest)}</code></dd>"
        "</dl>"
    )
    forms = _decision_forms(record, page, digest) if open_ else ""
    body = (
        f"<h1>Call {escape(record.request_id)}</h1>{said}"
        f'<p class="status {"open" if open_ else "closed"}">{status}</p>'
        f"{facts}<h2>Arguments</h2>{_arguments(record.body.get('arguments'))}{forms}"
        f"<h2>Audit events</h2>{_events(events, with_call=False)}"
    )
    return _layout(f"Call {record.request_id}", body, page)


def _decision_forms(record: Parked, page: Page, digest: str) -> str:
    quoted = urllib.parse.quote(record.request_id, safe="")
    who = "" if page.token else (
        '<label>Your name <input type="text" name="by" maxlength="200" '
        'placeholder="this machine\'s user"></label>'
    )
    return (
        '<div class="decide">'
        f'<form method="post" action="/calls/{escape(quoted)}/approve" class="approve">'
        f'{_csrf(page)}<input type="hidden" name="digest" value="{escape(digest)}">'
        f"{who}"
        '<label>Note (optional) <input type="text" name="reason" maxlength="2000"></label>'
        '<button type="submit" class="approve">Approve</button>'
        "<p>Runs it once, with exactly the arguments above.</p></form>"
        f'<form method="post" action="/calls/{escape(quoted)}/reject" class="reject">'
        f"{_csrf(page)}{who}"
        '<label>Reason (the agent reads it) <input type="text" name="reason" required '
        'maxlength="2000"></label>'
        '<button type="submit" class="reject">Reject</button></form>'
        "</div>"
    )


def audit_page(
    events: Iterable[Mapping[str, str]],
    page: Page,
    *,
    verdict: Mapping[str, Any],
    filters: Mapping[str, str],
    error: str | None = None,
    shown_at_most: int,
) -> str:
    """``/audit``: the trail (filtered), and whether it is whole (``audit --verify``)."""
    listed = list(events)
    options = "".join(
        f'<option value="{name}"{" selected" if filters.get("event") == name else ""}>'
        f"{name}</option>"
        for name in ("", *AUDIT_EVENTS)
    )
    form = (
        '<form method="get" action="/audit" class="filters">'
        '<label>request id <input type="text" name="request_id" '
        f'value="{escape(filters.get("request_id", ""))}"></label>'
        '<label>since <input type="text" name="since" placeholder="15m, 2h, 7d or ISO time" '
        f'value="{escape(filters.get("since", ""))}"></label>'
        f'<label>event <select name="event">{options}</select></label>'
        '<button type="submit">Filter</button></form>'
    )
    said = f'<p class="error" role="alert">{escape(error)}</p>' if error else ""
    more = (f"<p>The newest {shown_at_most} events are shown.</p>"
            if len(listed) >= shown_at_most else "")
    body = (
        f"<h1>Audit trail</h1>{_verdict(verdict)}{form}{said}{more}"
        f"{_events(listed, with_call=True)}"
    )
    return _layout("Audit trail", body, page)


def _verdict(verdict: Mapping[str, Any]) -> str:
    events, writers = verdict["events"], verdict["writers"]
    if verdict["whole"]:
        head = (f'<p class="verify whole">Audit trail whole: {events} events from {writers} '
                "writer(s), every one sealed by a worker.</p>")
    else:
        problems = "".join(f"<li>{escape(p)}</li>" for p in verdict["problems"])
        head = (f'<div class="verify broken"><p>Audit trail NOT whole: '
                f"{len(verdict['problems'])} problem(s) in {events} events from {writers} "
                f"writer(s).</p><ul>{problems}</ul></div>")
    if not verdict["keyed"]:
        head += ('<p class="note">Checked without CLEVERAGENTS_AUDIT_KEY: gaps, trims and '
                 "events added by hand show; set the workers' key here to check their "
                 "seals.</p>")
    return head


#: The stylesheet (served at /static/inbox.css).
STYLE = """
body{font:15px/1.45 system-ui,sans-serif;margin:0;color:#1d232b;background:#f6f7f9}
nav{background:#1d232b;padding:.6em 1.2em;display:flex;gap:1.2em;align-items:center}
nav a,nav .who,nav button.link{color:#e8edf3;text-decoration:none}
nav .who{margin-left:auto}
main{max-width:1100px;margin:1.5em auto;padding:0 1.2em}
table{border-collapse:collapse;width:100%;background:#fff;margin-bottom:1.2em}
th,td{text-align:left;padding:.45em .7em;border-bottom:1px solid #e2e6eb;vertical-align:top}
thead th{background:#eef1f5;font-weight:600}
table.arguments th{width:14em;font-family:ui-monospace,monospace;font-weight:500}
pre{margin:0;white-space:pre-wrap;word-break:break-word;font:13px/1.4 ui-monospace,monospace}
dl.facts{display:grid;grid-template-columns:9em 1fr;gap:.25em 1em;background:#fff;
padding:.8em 1em;border:1px solid #e2e6eb}
dl.facts dt{color:#5b6570}dl.facts dd{margin:0;word-break:break-all}
.status{padding:.6em .9em;border-radius:4px}
.status.open{background:#fff4d6;border:1px solid #f0cf76}
.status.closed{background:#e9eef4;border:1px solid #c9d3de}
.error{background:#fde2e1;border:1px solid #e99b97;padding:.6em .9em;border-radius:4px}
.decide{display:flex;gap:1.5em;flex-wrap:wrap;margin:1em 0}
.decide form{background:#fff;border:1px solid #e2e6eb;padding:.9em;flex:1;min-width:18em}
label{display:block;margin:.3em 0}
input[type=text],input[type=password],select{display:block;width:100%;
box-sizing:border-box;padding:.35em;margin-top:.2em}
form.filters{display:flex;gap:1em;align-items:flex-end;margin:1em 0}
form.filters label{flex:1}
form.login{max-width:24em;background:#fff;border:1px solid #e2e6eb;padding:1em}
button{padding:.45em 1.1em;border-radius:4px;border:1px solid #8895a3;background:#fff;
cursor:pointer;font:inherit}
button.approve{background:#1f7a3d;border-color:#1f7a3d;color:#fff}
button.reject{background:#a32020;border-color:#a32020;color:#fff}
button.link{border:0;background:none;padding:0;text-decoration:underline}
form.inline{display:inline}
.verify.whole{color:#1f7a3d}.verify.broken{color:#a32020}
.note,.size,.empty{color:#5b6570}
"""

#: The one script (served at /static/inbox.js): ages and times left count in the browser,
#: and the list of waiting calls reloads itself.
SCRIPT = """
(function () {
  function span(s) {
    s = Math.max(0, s);
    if (s < 120) return Math.round(s) + "s";
    if (s < 7200) return Math.round(s / 60) + "m";
    if (s < 172800) return (s / 3600).toFixed(1) + "h";
    return (s / 86400).toFixed(1) + "d";
  }
  function tick() {
    var now = Date.now() / 1000;
    document.querySelectorAll("[data-since]").forEach(function (e) {
      e.textContent = span(now - parseFloat(e.dataset.since));
    });
    document.querySelectorAll("[data-until]").forEach(function (e) {
      var left = parseFloat(e.dataset.until) - now;
      e.textContent = left > 0 ? span(left) : "expired";
    });
  }
  document.addEventListener("DOMContentLoaded", function () {
    tick();
    setInterval(tick, 1000);
    var h = document.querySelector("[data-refresh]");
    if (h) setTimeout(function () { location.reload(); }, 1000 * h.dataset.refresh);
  });
})();
"""
