// The SDK's own World package, loaded when first needed: it is an ES module (which only a dynamic
// import loads from CommonJS on Node 20) and an optional peer dependency.
let loading;
module.exports = { loadSdkWorld: () => (loading ??= import('@workflow/world')) };
