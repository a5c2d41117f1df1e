"""The report page's inline style and script (kept here so page.py reads as the page's structure).

The script only adds conveniences (expand or collapse every section, filter the kernels) and marks
`<body data-ready="1">` when it has run, which the browser tests check; the page reads the same
without it.
"""

CSS = """
:root { --fg: #1d2330; --muted: #6b7280; --line: #e5e7eb; --brk: #fff1c2; --bad: #b42318; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: var(--fg); margin: 0 2rem 4rem; }
header h1 { margin: 1rem 0 0.2rem; }
nav { position: sticky; top: 0; background: #fff; padding: 0.5rem 0; border-bottom: 1px solid var(--line); z-index: 1; }
nav a { margin-right: 1rem; }
h2 { margin-top: 2rem; border-bottom: 2px solid var(--line); }
h3 { margin: 1.2rem 0 0.4rem; font-size: 1.05rem; }
code, pre { font: 12.5px/1.4 ui-monospace, "DejaVu Sans Mono", Menlo, monospace; }
pre { background: #f6f8fa; padding: 0.6rem; overflow-x: auto; border-radius: 4px; }
.summary { display: flex; flex-wrap: wrap; gap: 0.5rem; }
.stat { border: 1px solid var(--line); border-radius: 6px; padding: 0.3rem 0.7rem; min-width: 7.5rem; }
.stat b { display: block; font-size: 1.35rem; }
.stat span { color: var(--muted); font-size: 0.85em; }
.none { color: var(--muted); }
.where, .secs { color: var(--muted); font-weight: normal; font-size: 0.9em; }
.reason { color: var(--bad); }
.recompile, .failed, .eager { border-left: 3px solid var(--bad); padding-left: 0.5rem; }
article.frame, article.kernel { border: 1px solid var(--line); border-radius: 6px; padding: 0.2rem 1rem 0.6rem; margin: 1rem 0; }
table.source { border-collapse: collapse; width: 100%; background: #fbfbfc; }
table.source td { padding: 0 0.5rem; white-space: pre; }
table.source td.ln { color: var(--muted); text-align: right; width: 3rem; user-select: none; }
tr.brk { background: var(--brk); }
tr.brk td.ln { color: var(--bad); font-weight: 700; }
tr.brk-note td { background: var(--brk); font-size: 0.9em; white-space: normal; }
details { margin: 0.3rem 0; }
summary { cursor: pointer; }
.program { margin-left: 1.2rem; }
.chart text { font: 12px system-ui, sans-serif; fill: var(--fg); }
.legend .key { margin-right: 0.8rem; white-space: nowrap; }
.legend i { display: inline-block; width: 0.8rem; height: 0.8rem; margin-right: 0.25rem; vertical-align: -1px; }
.launch { color: var(--muted); }
.hidden { display: none; }
"""

SCRIPT = """
(function () {
  function all(open) { document.querySelectorAll('details').forEach(function (d) { d.open = open; }); }
  document.getElementById('expand').addEventListener('click', function () { all(true); });
  document.getElementById('collapse').addEventListener('click', function () { all(false); });
  var filter = document.getElementById('kernel-filter');
  var kernels = Array.prototype.slice.call(document.querySelectorAll('article.kernel'));
  var count = document.getElementById('kernel-count');
  function apply() {
    var q = filter ? filter.value.toLowerCase() : '';
    var shown = 0;
    kernels.forEach(function (k) {
      var hit = !q || k.textContent.toLowerCase().indexOf(q) >= 0;
      k.classList.toggle('hidden', !hit);
      if (hit) { shown += 1; }
    });
    if (count) { count.textContent = shown + ' of ' + kernels.length + ' kernels'; }
  }
  if (filter) { filter.addEventListener('input', apply); }
  apply();
  document.body.setAttribute('data-ready', '1');
})();
"""
