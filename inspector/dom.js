// DOM helpers: elements by id, new elements with their text set through textContent.
import { statusWord } from './format.js';

export const $ = (id) => document.getElementById(id);
export function el(tag, className, text) {
  const e = document.createElement(tag);
  if (className) e.className = className;
  if (text !== undefined && text !== null) e.textContent = String(text);
  return e;
}
export function setStatus(node, status) {
  const s = statusWord(status);
  node.dataset.status = s;
  node.textContent = s;
}
