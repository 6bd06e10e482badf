// The report page's shell: escaping (every string from the tree goes through esc), the inline
// style and script, and small building blocks. Nothing on the page loads from the network.
import { createHash } from 'crypto';

export const esc = (v: unknown): string => String(v).replace(/[&<>"']/g, (ch) => `&#${ch.charCodeAt(0)};`);

/** A relative link to a file of the tree, from the page's folder; the text escaped, the href percent-encoded. */
export function fileLink(relFromPage: string, text: string = relFromPage): string {
  const href = relFromPage.split('/').map(encodeURIComponent).join('/');
  return `<a href="${esc(href)}">${esc(text)}</a>`;
}

/** A JSON value for a table cell: short values inline, long ones in a <pre>. */
export function jsonCell(v: unknown): string {
  const flat = typeof v === 'string' ? v : JSON.stringify(v);
  if (flat === undefined) return '';
  if (flat.length <= 120 && !flat.includes('\n')) return esc(flat);
  const s = typeof v === 'string' ? v : JSON.stringify(v, null, 1);
  return `<pre>${esc(s.length > 20000 ? `${s.slice(0, 20000)} …` : s)}</pre>`;
}

export function kvTable(obj: Record<string, unknown>, cls = 'kv'): string {
  const rows = Object.entries(obj).map(([k, v]) => `<tr><th>${esc(k)}</th><td>${jsonCell(v)}</td></tr>`);
  return `<table class="${cls}">${rows.join('')}</table>`;
}

const CSS = `
body{font:13px/1.4 system-ui,sans-serif;margin:0 16px 40px;color:#222}
h1{font-size:20px;margin:12px 0 4px}h2{font-size:16px;border-bottom:1px solid #ccc;margin-top:24px}
h3{font-size:14px;margin:14px 0 4px}
.banner{padding:8px 12px;margin:8px 0;border-radius:4px;font-weight:600}
.banner.ok{background:#e6f4ea;color:#137333}.banner.bad{background:#fce8e6;color:#a50e0e}
.fail{color:#c5221f}.okc{color:#137333}
table{border-collapse:collapse;margin:4px 0}td,th{border:1px solid #ddd;padding:2px 6px;text-align:left;vertical-align:top}
table.kv th{background:#f6f6f6;font-weight:500;white-space:nowrap}
pre{margin:0;max-height:320px;overflow:auto;font-size:12px}
code,.mono{font-family:ui-monospace,monospace}
.grid td{width:14px;height:14px;padding:0;border:1px solid #fff}
.grid th{font-weight:400;font-size:11px;white-space:nowrap}
.grid th.col{writing-mode:vertical-rl;transform:rotate(180deg);max-height:180px;overflow:hidden}
.cell.complete,.key.complete{background:#34a853}.cell.missing,.key.missing{background:#ea4335}.cell.skipped,.key.skipped{background:#fbbc04}
.cell.corrupt,.key.corrupt{background:#7b1fa2}.cell.na,.key.na{background:#eee}
.legend span{display:inline-block;margin-right:12px}.legend i{display:inline-block;width:10px;height:10px;margin-right:4px;vertical-align:middle}
details.incident,details.bisect{border:1px solid #ddd;border-radius:4px;padding:4px 8px;margin:6px 0}
details.incident>summary,details.bisect>summary{cursor:pointer;font-weight:600}
.tokens span{display:inline-block;border:1px solid #ccc;border-radius:3px;margin:1px;padding:0 3px;font-family:ui-monospace,monospace}
.tokens span.hit{background:#fde293}
svg text{font:11px system-ui,sans-serif}
.flex{display:flex;flex-wrap:wrap;gap:12px;align-items:flex-start}
`;

// Filtering incidents by type; the page reads fine without it (the filter shows only once it runs).
const JS = `
(function(){
  var sel=document.getElementById('type-filter');
  if(!sel)return;
  sel.parentNode.hidden=false;
  sel.addEventListener('change',function(){
    var v=sel.value,n=0;
    document.querySelectorAll('details.incident').forEach(function(d){
      var show=!v||d.getAttribute('data-type')===v;d.style.display=show?'':'none';if(show)n++;
    });
    document.getElementById('type-count').textContent=String(n);
  });
})();
`;

/**
 * The page's policy: its own script only, by hash, so that escaping (esc) is not the only barrier
 * between a string from the tree and a script that runs.
 */
export const CSP = `default-src 'none'; img-src data:; style-src 'unsafe-inline'; script-src 'sha256-${createHash('sha256').update(JS).digest('base64')}'`;

export function page(title: string, banner: string, sections: string[]): string {
  return `<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="${CSP}">
<title>${esc(title)}</title><style>${CSS}</style></head>
<body>
<h1>${esc(title)}</h1>
${banner}
${sections.join('\n')}
<script>${JS}</script>
</body></html>
`;
}

/** The fixed colours of incident types (others get a colour from their name). */
const TYPE_COLOURS: Record<string, string> = {
  token_repeat: '#4285f4',
  logits_finite: '#ea4335',
  garbled: '#fbbc04',
  spec_acceptance: '#34a853',
  manual_trigger: '#9334e6',
  rank_divergence: '#e8710a',
};

export function typeColour(type: string): string {
  if (TYPE_COLOURS[type]) return TYPE_COLOURS[type];
  let h = 0;
  for (const c of type) h = (h * 31 + c.charCodeAt(0)) % 360;
  return `hsl(${h},60%,45%)`;
}
