// The one behaviour the pages need: following a link to a collapsed section opens it.
function openTarget() {
  const id = decodeURIComponent(location.hash.slice(1));
  let el = id && document.getElementById(id);
  if (!el) return;
  for (let p = el; p; p = p.parentElement) {
    if (p.tagName === "DETAILS") p.open = true;
  }
  el.scrollIntoView({block: "start"});
}
window.addEventListener("hashchange", openTarget);
document.addEventListener("DOMContentLoaded", openTarget);
