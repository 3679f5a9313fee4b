// Type-checks Grafana dashboard JSON files against Grafana's own schema types (@grafana/schema,
// version pinned in package.json): the dashboard as `Dashboard`, and each panel's `options` and
// `fieldConfig.defaults.custom` against the schema of its own panel type (a barchart's against
// BarChartPanelCfg, ...). Object literals get TypeScript's excess-property check, so a key the
// schema does not have (`stacking` in a barchart's field config, say) is an error, as is a
// wrong type or a missing required field.
//
//   node check.mjs DASHBOARD.json ...      exit 0: all match; 1: tsc's errors; 2: bad input
//
// The generated TypeScript goes to build/ beside this file (one .ts per dashboard).
import { execFileSync } from "node:child_process";
import { mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { basename, dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const schema = JSON.parse(
  readFileSync(join(here, "node_modules/@grafana/schema/package.json"), "utf8"),
);

// A panel type's schema module, from the package's own export map: "state-timeline" is
// .../composable/statetimeline/panelcfg/x/StateTimelinePanelCfg_types.gen. Returns the import
// path and whether the panel has custom field config of its own (a stat panel has none).
function panelModule(type) {
  const dir = type.replaceAll("-", "");
  const key = Object.keys(schema.exports).find((k) =>
    k.includes(`/raw/composable/${dir}/panelcfg/`),
  );
  if (!key) {
    throw new Error(`no schema in @grafana/schema ${schema.version} for panel type "${type}"`);
  }
  const types = readFileSync(
    join(here, "node_modules/@grafana/schema", schema.exports[key].types),
    "utf8",
  );
  return {
    path: `@grafana/schema${key.slice(1)}`,
    hasFieldConfig: /export interface FieldConfig\b/.test(types),
  };
}

const build = join(here, "build");
rmSync(build, { recursive: true, force: true });
mkdirSync(build);

const files = process.argv.slice(2);
if (files.length === 0) {
  console.error("usage: node check.mjs DASHBOARD.json ...");
  process.exit(2);
}
const names = [];
for (const file of files) {
  let dashboard;
  try {
    dashboard = JSON.parse(readFileSync(file, "utf8"));
  } catch (e) {
    console.error(`${file}: ${e.message}`);
    process.exit(2);
  }
  const name = basename(file, ".json").replace(/[^A-Za-z0-9_]/g, "_");
  const imports = new Map();
  const lines = [];
  // Every panel is checked on its own against its type's schema; the dashboard then holds them.
  const typed = (panel, i) => {
    if (panel.type === "row") {
      const { panels, ...row } = panel;
      return `{ ...${JSON.stringify(row)}, panels: [${(panels ?? []).map((p, j) => typed(p, `${i}_${j}`)).join(", ")}] }`;
    }
    let module;
    try {
      module = panelModule(panel.type);
    } catch (e) {
      console.error(`${file}: panel ${JSON.stringify(panel.title)}: ${e.message}`);
      process.exit(2);
    }
    const alias = panel.type.replaceAll("-", "_");
    imports.set(alias, module.path);
    const custom = module.hasFieldConfig ? `${alias}.FieldConfig` : "Record<string, never>";
    // Targets are datasource queries (PromQL here): the dashboard schema types them only as
    // DataQuery, so they are checked structurally (refId required), not for extra keys.
    const { targets, ...rest } = panel;
    lines.push(`const targets_${i} = ${JSON.stringify(targets ?? [])};`);
    lines.push(
      `// ${JSON.stringify(panel.title)}\nconst panel_${i} = { ...${JSON.stringify(rest, null, 2)}, targets: targets_${i} } satisfies Strict<${alias}.Options, ${custom}>;`,
    );
    return `panel_${i}`;
  };
  const { panels, ...top } = dashboard;
  const typedPanels = (panels ?? []).map((p, i) => typed(p, i));
  const source = [
    `import type { Dashboard, Panel, FieldConfigSource, FieldConfig } from "@grafana/schema";`,
    ...[...imports].map(([alias, module]) => `import type * as ${alias} from "${module}";`),
    ``,
    `// A dashboard is JSON: where the schema has a TypeScript string enum (StackingMode.Normal),`,
    `// JSON has its value ("normal"). Partial: Grafana fills in the defaults of what is left out.`,
    `type Json<T> = T extends string ? \`\${T}\` : T extends Array<infer E> ? Array<Json<E>> : T extends object ? { [K in keyof T]: Json<T[K]> } : T;`,
    `type JsonPartial<T> = T extends string ? \`\${T}\` : T extends Array<infer E> ? Array<JsonPartial<E>> : T extends object ? { [K in keyof T]?: JsonPartial<T[K]> } : T;`,
    `// Grafana's Panel types options and custom field config as open records; closed here so an`,
    `// unknown key is an error, every other field as Grafana declares it.`,
    `type Strict<O, F> = Json<Omit<Panel, "options" | "fieldConfig">> & {`,
    `  options?: JsonPartial<O>;`,
    `  fieldConfig?: Json<Omit<FieldConfigSource, "defaults">> & {`,
    `    defaults: Json<Omit<FieldConfig, "custom">> & { custom?: JsonPartial<F> };`,
    `  };`,
    `};`,
    ``,
    ...lines,
    ``,
    `export const dashboard: Json<Dashboard> = { ...${JSON.stringify(top, null, 2)}, panels: [${typedPanels.join(", ")}] };`,
    ``,
  ].join("\n");
  writeFileSync(join(build, `${name}.ts`), source);
  names.push(`${name}.ts`);
}

writeFileSync(
  join(build, "tsconfig.json"),
  JSON.stringify({
    compilerOptions: {
      strict: true,
      noEmit: true,
      module: "esnext",
      moduleResolution: "bundler",
      target: "es2022",
      skipLibCheck: true,
      typeRoots: [],
    },
    files: names,
  }),
);
try {
  execFileSync(join(here, "node_modules/.bin/tsc"), ["-p", join(build, "tsconfig.json")], {
    stdio: "inherit",
    cwd: build,
  });
} catch {
  console.error(`dashboards do not match @grafana/schema ${schema.version} (generated TypeScript in ${build})`);
  process.exit(1);
}
console.log(`${files.length} dashboard(s) match @grafana/schema ${schema.version}`);
