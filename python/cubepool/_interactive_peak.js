// The address space at the peak (cubepool._interactive_peak): for each replay, one bar
// per reserved segment, as wide as its bytes, laid out in rows (PyTorch memory_viz's
// segment view); live blocks blue (what they asked for) and orange (their rounding),
// free bytes of pinned segments grey, idle segments pale red. Hover shows a block's
// allocation, bytes and stack frames. A view holds a bounded number of segments, block
// bars and frames (see the module): the segments left out are drawn as one dashed bar,
// and the title counts them. Plain ES5, no library: the page works offline.
(function () {
  "use strict";
  var F = JSON.parse(document.getElementById("cubepool-data").textContent);
  var root = document.getElementById("cubepool-peak");
  if (!root || !F.at_peak || !F.at_peak.length) return;
  var NS = "http://www.w3.org/2000/svg";
  var COLORS = {asked: "#4c78a8", rounding: "#f58518", free: "#e6e6e6", idle: "#f6c9c4",
    left: "#fafafa"};
  var ROW = 22, GAP = 3, LEFT = 8, ROWS = 8;

  function esc(s) {
    return String(s).replace(/[&<>"]/g, function (c) {
      return {"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;"}[c];
    });
  }
  function size(b) {
    var units = [[1073741824, "GiB"], [1048576, "MiB"], [1024, "KiB"]];
    for (var i = 0; i < units.length; i++) {
      if (b >= units[i][0]) return (b / units[i][0]).toFixed(1) + " " + units[i][1];
    }
    return b + " B";
  }
  function el(name, attrs) {
    var node = document.createElementNS(NS, name);
    for (var k in attrs) node.setAttribute(k, attrs[k]);
    return node;
  }

  // The page's tooltip (_interactive.js, which runs first).
  var show = window.cubepoolTip.show, hide = window.cubepoolTip.hide;

  var heading = document.createElement("h2");
  heading.className = "peak-heading";
  heading.textContent = "Why reserved exceeds live: the address space at each replay's peak";
  root.appendChild(heading);
  var legend = document.createElement("div");
  legend.className = "legend peak-legend";
  legend.innerHTML = [["asked", "live: asked for"], ["rounding", "live: rounding"],
    ["free", "free inside a pinned segment"], ["idle", "idle segment (no live block)"]]
    .map(function (c) {
      return '<span><i class="sw" style="background:' + COLORS[c[0]] + '"></i>' + c[1] + "</span>";
    }).join("");
  root.appendChild(legend);

  var views = F.at_peak.map(function (v) {
    var box = document.createElement("div");
    box.className = "peak";
    var title = document.createElement("div");
    title.className = "title peak-title";
    var gap = v.reserved - v.requested;
    title.innerHTML = "<b>" + esc(v.label) + "</b>: " + size(v.reserved) + " reserved in " +
      v.segment_count.toLocaleString("en") + " segments at event " + v.event.toLocaleString("en") +
      ", " + size(v.requested) + " asked for. The gap, " + size(gap) + ": " + size(v.free_in_pinned) +
      " free inside " + v.pinned_segments.toLocaleString("en") + " pinned segments, " +
      size(v.rounding) + " rounding, " + size(v.idle) + " in " + v.idle_segments.toLocaleString("en") +
      " idle segments." + (v.left_out.segments ? " Drawn: the " + v.segments.length.toLocaleString("en") +
      " segments with the most free bytes and the largest; " + leftText(v.left_out) + " (the dashed bar)." : "") +
      (v.merged ? " (Segments with many blocks show neighbouring blocks merged.)" : "") +
      (v.stacks_left_out ? " Stacks of " + v.stacks_left_out.toLocaleString("en") +
        " blocks left out (the page keeps a few thousand frames)." : "");
    var svg = el("svg", {"class": "peak-map"});
    box.appendChild(title);
    box.appendChild(svg);
    root.appendChild(box);
    return {v: v, svg: svg};
  });

  // The segments a view left out, in words.
  function leftText(left) {
    return left.segments.toLocaleString("en") + " more segment" + (left.segments === 1 ? "" : "s") +
      ", " + size(left.reserved) + " (" + size(left.live) + " live), not drawn one by one";
  }
  // The blocks a bar holds: one, or minus its id where merged.
  function blockCount(row) { return row[3] >= 0 ? 1 : -row[3]; }
  function blockTip(v, seg, row) {
    var lines = [];
    if (row[3] >= 0) {
      lines.push("<b>allocation " + row[3] + "</b>: " + size(row[1]) + " (asked " + size(row[2]) + ")");
    } else {
      lines.push("<b>" + (-row[3]).toLocaleString("en") + " blocks, merged</b>: " + size(row[1]) +
        " (asked " + size(row[2]) + ")");
    }
    // Each distinct stack and frame is written once: a block names its stack, a stack
    // its frames (cubepool._interactive_peak._Stacks).
    var stack = v.frames[String(row[3])];
    if (stack !== undefined) {
      v.stacks[stack].forEach(function (f) { lines.push("&nbsp;&nbsp;" + esc(v.frame_texts[f])); });
    }
    lines.push(segTip(seg));
    return lines.join("<br>");
  }
  function segTip(seg) {
    var live = seg[3].reduce(function (a, r) { return a + r[1]; }, 0);
    var blocks = seg[3].reduce(function (a, r) { return a + blockCount(r); }, 0);
    return "segment " + seg[0] + ":0x" + seg[1].toString(16) + ": " + size(seg[2]) + ", " +
      size(live) + " live, " + size(seg[2] - live) + " free, " + blocks.toLocaleString("en") + " blocks";
  }

  function draw() {
    // One width for every view, taken before any is drawn (drawing one may change the
    // page's scroll bar, and so the width, before the next).
    var width = Math.max(200, root.clientWidth - 2 * LEFT - 16);
    views.forEach(function (view) {
      var v = view.v, svg = view.svg;
      while (svg.firstChild) svg.removeChild(svg.firstChild);
      var largest = v.segments.reduce(function (a, s) { return Math.max(a, s[2]); }, 1);
      var capacity = Math.max(largest, v.reserved / ROWS);
      var scale = width / capacity, x = 0, y = 0;
      v.segments.forEach(function (seg) {
        var w = seg[2] * scale;
        if (x > 0 && x + w > width + 0.5) { x = 0; y += ROW + GAP; }
        var idle = seg[3].length === 0;
        var g = el("g", {});
        var back = el("rect", {x: LEFT + x, y: y, width: Math.max(w, 0.5), height: ROW,
          fill: idle ? COLORS.idle : COLORS.free, stroke: "#777", "stroke-width": 0.5});
        back.addEventListener("mousemove", function (ev) { show(ev, (idle ? "<b>idle</b> " : "") + segTip(seg)); });
        g.appendChild(back);
        seg[3].forEach(function (row) {
          var bx = LEFT + x + row[0] * scale, bw = row[1] * scale, aw = row[2] * scale;
          var asked = el("rect", {x: bx, y: y + 1, width: Math.max(aw, 0.4), height: ROW - 2, fill: COLORS.asked,
            stroke: "#fff", "stroke-width": bw > 3 ? 0.5 : 0});
          g.appendChild(asked);
          if (bw - aw > 0.05) {
            g.appendChild(el("rect", {x: bx + aw, y: y + 1, width: bw - aw, height: ROW - 2, fill: COLORS.rounding}));
          }
          var hit = el("rect", {x: bx, y: y, width: Math.max(bw, 0.6), height: ROW, fill: "transparent"});
          hit.addEventListener("mousemove", function (ev) { show(ev, blockTip(v, seg, row)); });
          g.appendChild(hit);
        });
        svg.appendChild(g);
        x += w + 2;
      });
      if (v.left_out.segments) {
        // The segments left out, as one bar as wide as their bytes (a row at most).
        var w = Math.min(Math.max(v.left_out.reserved * scale, 0.5), width);
        if (x > 0 && x + w > width + 0.5) { x = 0; y += ROW + GAP; }
        var rest = el("rect", {x: LEFT + x, y: y, width: w, height: ROW, fill: COLORS.left,
          stroke: "#777", "stroke-width": 0.7, "stroke-dasharray": "3,2"});
        rest.addEventListener("mousemove", function (ev) { show(ev, leftText(v.left_out)); });
        svg.appendChild(rest);
      }
      svg.setAttribute("height", y + ROW + 2);
      svg.addEventListener("mouseleave", hide);
    });
  }
  window.addEventListener("resize", draw);
  draw();
})();
