"""The web dashboard of ``gpuloom serve``: static files served at ``/`` and ``/ui/`` (package data).

A small static bundle rather than server-rendered pages: ``index.html``,
``static/app.js`` (plain JavaScript, no framework, no build step) and
``static/app.css``.  The page is a client of the same JSON API as the CLI:
it asks for a token at login, keeps it in the tab's ``sessionStorage`` and
sends it as ``Authorization: Bearer``.  So who may see or cancel what is
decided by the API alone (a non-owner's cancel button is disabled, and the
API would refuse it anyway); there is no session store and no cookie, hence
no CSRF surface.  Charts are inline SVG drawn by ``app.js``; nothing is loaded
from outside the service.

Views: the overview (cluster map of nodes x GPUs with the jobs holding each,
utilisation and queue-length charts over a chosen range, the queue with states,
reasons and queues, filters, search and arrays collapsed to a row), a job page
(spec, lifecycle timeline, progress chart from the job's ``GPULOOM_PROGRESS``
lines, NVML telemetry, log tail, cancel), the queues (tree, usage vs guarantee
vs limit over time) and the history (accounting).

The queue shows how many jobs are active and one page of them at a time, by
id (500; ``?page=N`` in the address for another size), with Previous and Next:
a page is one ``GET /jobs`` (``limit``, ``after``, ``fields``; the count from
``X-Total-Count``), so a queue of any length costs the browser one page.
"""
