// The interactive picture of cubepool.plot: reads the payload, draws every panel as SVG
// sized to the window, and handles hover, zoom (wheel), pan (drag) and reset
// (double-click, button). Plain ES5, no library: the page works offline.
(function () {
  "use strict";
  var F = JSON.parse(document.getElementById("cubepool-data").textContent);
  var NS = "http://www.w3.org/2000/svg";
  var root = document.getElementById("cubepool-figure");
  var fallback = document.getElementById("cubepool-static");
  if (fallback) fallback.style.display = "none";
  root.style.display = "block";
  var H = 240, M = {left: 64, right: 18, top: 10, bottom: 30};
  var full = [0, F.x_max], view = full.slice();
  var minSpan = F.x_max / 20000 || 1e-9;
  var phaseX = F.phases.map(function (ph) { return ph[1]; });  // in time order

  function esc(s) {
    return String(s).replace(/[&<>"]/g, function (c) {
      return {"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;"}[c];
    });
  }
  function num(v) {
    if (v === 0) return "0";
    var a = Math.abs(v);
    if (a >= 1000) return Math.round(v).toLocaleString("en");
    return a >= 10 ? v.toFixed(1).replace(/\.0$/, "") : v.toPrecision(3).replace(/\.?0+$/, "");
  }
  function bytes(v) { return num(v) + " " + F.unit; }
  function xText(x) { return F.by_event ? "event " + Math.round(x).toLocaleString("en") : num(x) + " s"; }
  // Whole ticks only when `whole` (an axis in bytes has no fraction of a byte).
  function ticks(lo, hi, n, whole) {
    var span = hi - lo;
    if (!(span > 0)) return [lo];
    var raw = span / n, mag = Math.pow(10, Math.floor(Math.log10(raw))), step = mag;
    [1, 2, 2.5, 5, 10].some(function (m) { step = m * mag; return step >= raw; });
    if (whole) step = Math.max(1, Math.ceil(step));
    var out = [], t = Math.ceil(lo / step) * step;
    for (; t <= hi + step * 1e-6; t += step) out.push(t);
    return out;
  }
  function lower(xs, v) {
    var lo = 0, hi = xs.length;
    while (lo < hi) { var mid = (lo + hi) >> 1; if (xs[mid] < v) lo = mid + 1; else hi = mid; }
    return lo;
  }

  var tip = document.createElement("div");
  tip.className = "tip";
  document.body.appendChild(tip);

  var panels = F.panels.map(function (p, index) {
    var box = document.createElement("div");
    box.className = "panel";
    var title = document.createElement("div");
    title.className = "title" + (p.complete ? "" : " incomplete");
    title.textContent = p.title;
    var svg = document.createElementNS(NS, "svg");
    var legend = document.createElement("div");
    legend.className = "legend";
    var items = p.pools.map(function (s) {
      return '<span><i class="sw" style="background:' + s.color + ';opacity:.65"></i>' +
        esc(s.label) + "</span>";
    });
    items.push('<span><i class="ln" style="border-color:#222"></i>reserved</span>');
    items.push('<span><i class="ln" style="border-color:#c0392b"></i>in use (min-max)</span>');
    items.push('<span><i class="ln" style="border-color:#555;border-top-style:dotted"></i>' +
      "peak live (the floor)</span>");
    if (F.recorded) {
      items.push('<span><i class="ln" style="border-color:#8e44ad;border-top-style:dashed"></i>' +
        esc(F.recorded.label) + "</span>");
    }
    legend.innerHTML = items.join("");
    // How many phase names the last draw had no room for (zooming in shows them).
    var note = document.createElement("span");
    note.className = "phase-note";
    note.style.color = "#555";
    legend.appendChild(note);
    box.appendChild(title);
    box.appendChild(svg);
    box.appendChild(legend);
    root.appendChild(box);
    return {p: p, svg: svg, note: note, index: index, width: 0};
  });

  // The most rows of phase names at a plot's foot (plot._PHASE_LABEL_ROWS).
  var PHASE_LABEL_ROWS = 6;
  // The fewest pixels between two phase lines (plot._PHASE_LINE_GAP).
  var PHASE_LINE_GAP = 6;

  // <char-em> About how wide a character is, in ems, and a text in pixels: plot._char_em
  // and plot._text_px (at or over DejaVu Sans' advances). Keep the two in step:
  // test_plot_scale checks they agree on every printable ASCII character.
  var NARROW = " .,:;'|ilIj-/", MEDIUM = "!()[]\"`", WIDE = "mwMW@%", SYMBOL = "<>=+~^#$*_&{}";
  function charEm(c) {
    if (NARROW.indexOf(c) >= 0) return 0.37;
    if (MEDIUM.indexOf(c) >= 0) return 0.5;
    if ("ftr".indexOf(c) >= 0) return 0.43;
    if (WIDE.indexOf(c) >= 0) return 1.0;
    if (SYMBOL.indexOf(c) >= 0) return 0.86;
    // A digit, an upper-case letter (one that has a lower case), any other character.
    return c >= "0" && c <= "9" ? 0.65 : c !== c.toLowerCase() ? 0.8 : 0.64;
  }
  // The characters of `s` as Python counts them: a surrogate pair is one.
  function chars(s) { return s.match(/[\ud800-\udbff][\udc00-\udfff]|[\s\S]/g) || []; }
  function textPx(s, size) {
    var em = 0;
    chars(s).forEach(function (c) { em += charEm(c); });
    return em * size;
  }
  // </char-em>

  // `name` as drawn in 9-pixel text in `room` pixels: whole where it fits, else cut
  // where it fills them and ended in an ellipsis (plot cuts at a space where it can).
  function fitName(name, room) {
    if (textPx(name, 9) <= room) return name;
    var cs = chars(name), em = charEm("\u2026"), n = 0;
    while (n < cs.length && (em + charEm(cs[n])) * 9 <= room) em += charEm(cs[n++]);
    return cs.slice(0, n).join("") + "\u2026";
  }

  // The row of each phase label starting at `xs` (pixels, in time order), `widths`
  // pixels wide: the lowest of the first `maxRows` rows where it does not run into the
  // label before it, or -1 where none has room; as plot._label_rows does. At most
  // maxRows rows are looked at a label: linear in the labels on every redraw.
  function labelRows(xs, widths, maxRows) {
    var ends = [], rows = [];
    for (var k = 0; k < xs.length; k++) {
      var row = 0;
      while (row < ends.length && xs[k] < ends[row]) row++;
      if (row >= maxRows) { rows.push(-1); continue; }
      ends[row] = xs[k] + widths[k];
      rows.push(row);
    }
    return rows;
  }

  function geometry(panel) {
    var W = panel.svg.clientWidth || root.clientWidth || 900;
    var pw = Math.max(W - M.left - M.right, 50), ph = H - M.top - M.bottom;
    var span = view[1] - view[0];
    return {
      W: W, pw: pw, ph: ph,
      sx: function (x) { return M.left + pw * (x - view[0]) / span; },
      sy: function (y) { return M.top + ph * (1 - y / (panel.p.y_max || F.y_max)); },
      xAt: function (px) { return view[0] + (px - M.left) / pw * span; }
    };
  }

  function draw() {
    panels.forEach(function (panel) {
      var p = panel.p, g = geometry(panel), sx = g.sx, sy = g.sy, out = [];
      panel.width = g.W;
      panel.svg.setAttribute("viewBox", "0 0 " + g.W + " " + H);
      var clip = "clip" + panel.index;
      out.push('<defs><clipPath id="' + clip + '"><rect x="' + M.left + '" y="' + M.top +
        '" width="' + g.pw + '" height="' + g.ph + '"/></clipPath></defs>');
      ticks(0, (p.y_max || F.y_max) / 1.12, 5, F.unit === "B").forEach(function (t) {
        var y = sy(t).toFixed(1);
        out.push('<line x1="' + M.left + '" x2="' + (M.left + g.pw) + '" y1="' + y + '" y2="' + y +
          '" stroke="#eee"/><text x="' + (M.left - 5) + '" y="' + (+y + 3) +
          '" text-anchor="end" font-size="10">' + num(t) + "</text>");
      });
      out.push('<text x="14" y="' + (M.top + g.ph / 2) + '" font-size="11" text-anchor="middle" ' +
        'transform="rotate(-90 14 ' + (M.top + g.ph / 2) + ')">' + esc(F.unit) + "</text>");
      var a = Math.max(lower(p.x, view[0]) - 1, 0), b = Math.min(lower(p.x, view[1]) + 1, p.x.length - 1);
      var xs = [];
      for (var i = a; i <= b; i++) xs.push(i);
      function pts(ys) {
        return xs.map(function (i) { return sx(p.x[i]).toFixed(1) + "," + sy(ys[i]).toFixed(1); }).join(" ");
      }
      function back(ys) {
        return xs.slice().reverse().map(function (i) {
          return sx(p.x[i]).toFixed(1) + "," + sy(ys[i]).toFixed(1);
        }).join(" ");
      }
      var g2 = ['<g clip-path="url(#' + clip + ')">'];
      var base = p.x.map(function () { return 0; });
      p.pools.forEach(function (s) {
        var upper = base.map(function (v, i) { return v + s.values[i]; });
        g2.push('<polygon points="' + pts(upper) + " " + back(base) + '" fill="' + s.color +
          '" fill-opacity="0.6"/>');
        base = upper;
      });
      g2.push('<polygon points="' + pts(p.in_high) + " " + back(p.in_low) +
        '" fill="#c0392b" fill-opacity="0.25"/>');
      g2.push('<polyline points="' + pts(p.reserved) + '" fill="none" stroke="#222" stroke-width="1"/>');
      g2.push('<polyline points="' + pts(p.in_high) + '" fill="none" stroke="#c0392b" stroke-width="1"/>');
      var floor = sy(F.floor).toFixed(1);
      g2.push('<line x1="' + M.left + '" x2="' + (M.left + g.pw) + '" y1="' + floor + '" y2="' + floor +
        '" stroke="#555" stroke-dasharray="2,3"/>');
      if (F.recorded) {
        var rec = F.recorded.x.map(function (x, i) {
          return sx(x).toFixed(1) + "," + sy(F.recorded.y[i]).toFixed(1);
        }).join(" ");
        g2.push('<polyline points="' + rec + '" fill="none" stroke="#8e44ad" stroke-width="1.3" ' +
          'stroke-dasharray="5,3"/>');
      }
      // Phase names at the foot, as the static picture lays them out: a name goes a row
      // up when it would run into the one before it (rows packed by the widths names
      // are drawn at), in at most PHASE_LABEL_ROWS rows of 11 pixels; a name is drawn
      // right of its line or, where it would run out of the plot, left of it (one wider
      // than the plot is cut); a name over the peak's label is left out. A phase line
      // PHASE_LINE_GAP pixels at least from the last. Only the phases in view: the first
      // found by bisection.
      var edge = M.left + g.pw, shown = [], names = [], starts = [], widths = [];
      for (var k = lower(phaseX, view[0]); k < F.phases.length; k++) {
        var x = sx(phaseX[k]);
        if (x > edge) break;
        if (x < M.left) continue;
        var name = fitName(F.phases[k][0], g.pw - 6);
        var w = Math.max((name.length + 1) * 5, 3 + textPx(name, 9));
        shown.push(x);
        names.push(name);
        widths.push(w);
        starts.push(x + w <= edge ? x : Math.max(M.left, Math.min(x - 3, edge) - w));
      }
      var rows = labelRows(
        starts, widths, Math.min(PHASE_LABEL_ROWS, Math.max(1, Math.floor((g.ph - 13) / 11) + 1)));
      // The peak's marker and label (where in view), which no name is drawn over.
      var px = sx(p.peak_x), py = sy(p.peak);
      var peakShown = px >= M.left - 1 && px <= edge + 1, right = px > M.left + g.pw * 0.7;
      if (peakShown) {
        var peakW = textPx(p.peak_text, 10);
        var peakX0 = right ? px - 10 - peakW : px - 6, peakX1 = right ? px + 6 : px + 10 + peakW;
        rows = rows.map(function (row, k) {
          var baseline = M.top + g.ph - 4 - 11 * row;
          var over = starts[k] < peakX1 && peakX0 < starts[k] + widths[k] &&
            baseline - 9 * 0.8 < py + 2 && py - 18 < baseline + 9 * 0.25;
          return row >= 0 && over ? -1 : row;
        });
      }
      var hidden = 0, drawn = -Infinity;
      shown.forEach(function (x, k) {
        if (x - drawn >= PHASE_LINE_GAP) {
          drawn = x;
          g2.push('<line x1="' + x.toFixed(1) + '" x2="' + x.toFixed(1) + '" y1="' + M.top + '" y2="' +
            (M.top + g.ph) + '" stroke="#888" stroke-dasharray="4,3" stroke-width="0.7"/>');
        }
        if (rows[k] < 0) { hidden++; return; }
        g2.push('<text x="' + (starts[k] + 3).toFixed(1) + '" y="' + (M.top + g.ph - 4 - 11 * rows[k]) +
          '" fill="#555" font-size="9">' + esc(names[k]) + "</text>");
      });
      panel.note.textContent = hidden ? "+" + hidden.toLocaleString("en") + " phase name" +
        (hidden === 1 ? "" : "s") + " not shown (no room; zoom in)" : "";
      if (peakShown) {
        g2.push('<path d="M' + (px - 4).toFixed(1) + "," + (py - 7).toFixed(1) + " L" + (px + 4).toFixed(1) +
          "," + (py - 7).toFixed(1) + " L" + px.toFixed(1) + "," + py.toFixed(1) + ' Z" fill="#222"/>' +
          '<text x="' + (px + (right ? -8 : 8)).toFixed(1) + '" y="' + (py - 8).toFixed(1) +
          '" text-anchor="' + (right ? "end" : "start") + '" font-size="10">' + esc(p.peak_text) + "</text>");
      }
      g2.push("</g>");
      out.push(g2.join(""));
      out.push('<rect x="' + M.left + '" y="' + M.top + '" width="' + g.pw + '" height="' + g.ph +
        '" fill="none" stroke="#999" stroke-width="0.6"/>');
      ticks(view[0], view[1], Math.max(2, Math.round(g.pw / 110)), F.by_event).forEach(function (t) {
        out.push('<text x="' + sx(t).toFixed(1) + '" y="' + (M.top + g.ph + 13) +
          '" text-anchor="middle" font-size="10">' + num(t) + "</text>");
      });
      out.push('<text x="' + (M.left + g.pw / 2) + '" y="' + (H - 3) + '" text-anchor="middle" font-size="11">' +
        esc(F.x_label) + "</text>");
      out.push('<line class="cursor" y1="' + M.top + '" y2="' + (M.top + g.ph) +
        '" stroke="#000" stroke-width="0.7" visibility="hidden"/>');
      panel.svg.innerHTML = out.join("");
    });
  }

  function nearest(p, x) {
    var i = lower(p.x, x);
    if (i >= p.x.length) return p.x.length - 1;
    if (i > 0 && x - p.x[i - 1] < p.x[i] - x) return i - 1;
    return i;
  }

  function hover(panel, ev) {
    var rect = panel.svg.getBoundingClientRect(), g = geometry(panel);
    var mx = ev.clientX - rect.left;
    if (mx < M.left || mx > M.left + g.pw || !panel.p.x.length) { leave(); return; }
    var x = g.xAt(mx);
    panels.forEach(function (other) {
      var line = other.svg.querySelector(".cursor");
      if (!line || !other.p.x.length) return;
      var og = geometry(other), xi = og.sx(other.p.x[nearest(other.p, x)]).toFixed(1);
      line.setAttribute("x1", xi);
      line.setAttribute("x2", xi);
      line.setAttribute("visibility", "visible");
    });
    var p = panel.p, i = nearest(p, x);
    var rows = ["<b>" + esc(p.label) + "</b> &middot; " + esc(xText(p.x[i])),
      "in use: " + bytes(p.in_high[i]) + (p.in_low[i] !== p.in_high[i] ? " (least " + bytes(p.in_low[i]) + ")" : ""),
      "reserved: " + bytes(p.reserved[i])];
    if (F.recorded) {
      // The recording is a step line: its value is that of the last point at or before x.
      var r = Math.max(lower(F.recorded.x, p.x[i] + 1e-12) - 1, 0);
      rows.push(esc(F.recorded.label) + ": " + bytes(F.recorded.y[r]) + " reserved");
    }
    p.pools.forEach(function (s) {
      if (s.values[i] > 0 || s.in_use[i] > 0) {
        rows.push('<i class="sw" style="background:' + s.color + ';opacity:.65"></i> ' + esc(s.label) +
          ": " + bytes(s.values[i]) + " reserved, " + bytes(s.in_use[i]) + " in use");
      }
    });
    showTip(ev, rows.join("<br>"));
  }

  // The tooltip with `html` beside the pointer, kept inside the window; shared with the
  // view at the peak (_interactive_peak.js) as window.cubepoolTip.
  function showTip(ev, html) {
    tip.innerHTML = html;
    tip.style.display = "block";
    var left = ev.clientX + 14, top = ev.clientY + 14;
    if (left + tip.offsetWidth > window.innerWidth - 4) left = ev.clientX - tip.offsetWidth - 14;
    if (top + tip.offsetHeight > window.innerHeight - 4) top = ev.clientY - tip.offsetHeight - 14;
    tip.style.left = left + "px";
    tip.style.top = top + "px";
  }
  window.cubepoolTip = {
    show: showTip,
    hide: function () { tip.style.display = "none"; }
  };

  function leave() {
    tip.style.display = "none";
    panels.forEach(function (other) {
      var line = other.svg.querySelector(".cursor");
      if (line) line.setAttribute("visibility", "hidden");
    });
  }

  function setView(lo, hi) {
    var span = Math.max(hi - lo, minSpan);
    span = Math.min(span, full[1] - full[0]);
    lo = Math.min(Math.max(lo, full[0]), full[1] - span);
    view = [lo, lo + span];
    draw();
  }

  var drag = null;
  panels.forEach(function (panel) {
    var svg = panel.svg;
    svg.addEventListener("mousemove", function (ev) {
      if (drag) {
        var g = geometry(drag.panel), dx = (ev.clientX - drag.x) / g.pw * (drag.view[1] - drag.view[0]);
        setView(drag.view[0] - dx, drag.view[1] - dx);
      }
      hover(panel, ev);
    });
    svg.addEventListener("mouseleave", leave);
    svg.addEventListener("mousedown", function (ev) {
      drag = {panel: panel, x: ev.clientX, view: view.slice()};
      ev.preventDefault();
    });
    svg.addEventListener("wheel", function (ev) {
      var rect = svg.getBoundingClientRect(), g = geometry(panel);
      var at = g.xAt(Math.min(Math.max(ev.clientX - rect.left, M.left), M.left + g.pw));
      var k = Math.exp(ev.deltaY * 0.0015);
      setView(at - (at - view[0]) * k, at + (view[1] - at) * k);
      hover(panel, ev);
      ev.preventDefault();
    }, {passive: false});
    svg.addEventListener("dblclick", function () { setView(full[0], full[1]); });
  });
  window.addEventListener("mouseup", function () { drag = null; });
  window.addEventListener("resize", draw);
  var reset = document.getElementById("cubepool-reset");
  if (reset) reset.addEventListener("click", function () { setView(full[0], full[1]); });
  draw();
})();
