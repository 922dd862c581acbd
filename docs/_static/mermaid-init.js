// Render the ```mermaid diagrams with the vendored mermaid.min.js (no CDN, works offline).
window.addEventListener("DOMContentLoaded", function () {
  var dark = document.body.dataset.theme === "dark" ||
    (document.body.dataset.theme !== "light" &&
     window.matchMedia && window.matchMedia("(prefers-color-scheme: dark)").matches);
  window.mermaid.initialize({startOnLoad: false, theme: dark ? "dark" : "default"});
  window.mermaid.run({querySelector: ".mermaid"});
});
