// Typeset the math with the vendored KaTeX (no network): pymdownx.arithmatex (generic mode) wraps
// the Markdown pages' and docstrings' formulas in .arithmatex elements with \( \) and \[ \]
// delimiters; the notebooks' Markdown cells keep Jupyter's $ and $$.
(function () {
  function typeset() {
    if (typeof renderMathInElement === "undefined") return;
    var delimiters = [
      {left: "$$", right: "$$", display: true},
      {left: "\\[", right: "\\]", display: true},
      {left: "\\(", right: "\\)", display: false},
      {left: "$", right: "$", display: false},
    ];
    document.querySelectorAll(".arithmatex").forEach(function (el) {
      renderMathInElement(el, {delimiters: delimiters.slice(1, 3), throwOnError: false});
    });
    document.querySelectorAll(".jupyter-wrapper .jp-MarkdownOutput, .jupyter-wrapper .jp-RenderedMarkdown").forEach(function (el) {
      renderMathInElement(el, {delimiters: delimiters, throwOnError: false,
                               ignoredClasses: ["highlight", "codehilite"]});
    });
  }
  if (typeof document$ !== "undefined") {
    document$.subscribe(typeset);
  } else {
    document.addEventListener("DOMContentLoaded", typeset);
  }
})();
