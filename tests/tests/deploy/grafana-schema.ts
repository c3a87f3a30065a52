// The dashboard type for tests/tests/deploy.rs: @grafana/schema's Dashboard, with each panel
// type's options and field config checked against that panel's own schema.
import type * as S from '@grafana/schema';
import type * as TimeSeries from '@grafana/schema/dist/esm/raw/composable/timeseries/panelcfg/x/TimeSeriesPanelCfg_types.gen';
import type * as Stat from '@grafana/schema/dist/esm/raw/composable/stat/panelcfg/x/StatPanelCfg_types.gen';
import type * as Table from '@grafana/schema/dist/esm/raw/composable/table/panelcfg/x/TablePanelCfg_types.gen';
import type * as BarGauge from '@grafana/schema/dist/esm/raw/composable/bargauge/panelcfg/x/BarGaugePanelCfg_types.gen';
import type * as Gauge from '@grafana/schema/dist/esm/raw/composable/gauge/panelcfg/x/GaugePanelCfg_types.gen';
import type * as Text from '@grafana/schema/dist/esm/raw/composable/text/panelcfg/x/TextPanelCfg_types.gen';
import type * as StateTimeline from '@grafana/schema/dist/esm/raw/composable/statetimeline/panelcfg/x/StateTimelinePanelCfg_types.gen';

// JSON spells a TypeScript enum member as its value ("absolute", not ThresholdsMode.Absolute).
type Json<T> = T extends string ? (string extends T ? T : `${T}`)
  : T extends number | boolean | null | undefined ? T
  : T extends ReadonlyArray<infer U> ? Array<Json<U>>
  : T extends object ? { [K in keyof T]: Json<T[K]> }
  : T;
// Grafana fills the options it is not given with defaults: every key optional, but no
// unknown key and no wrong type or value.
type DeepPartial<T> = T extends ReadonlyArray<infer U> ? Array<DeepPartial<U>>
  : T extends object ? { [K in keyof T]?: DeepPartial<T[K]> }
  : T;
type NoCustom = Record<string, never>;
type PanelOf<Type extends string, Options, Custom> =
  Omit<S.Panel, 'type' | 'options' | 'fieldConfig'> & {
    type: Type;
    options?: DeepPartial<Options>;
    fieldConfig?: Omit<S.FieldConfigSource, 'defaults'> & {
      defaults: Omit<S.FieldConfig, 'custom'> & { custom?: DeepPartial<Custom> };
    };
  };
// A panel type outside this list fails: add it here with its schema.
type KnownPanel =
  | PanelOf<'timeseries', TimeSeries.Options, TimeSeries.FieldConfig>
  | PanelOf<'stat', Stat.Options, NoCustom>
  | PanelOf<'table', Table.Options, Table.FieldConfig>
  | PanelOf<'bargauge', BarGauge.Options, NoCustom>
  | PanelOf<'gauge', Gauge.Options, NoCustom>
  | PanelOf<'text', Text.Options, NoCustom>
  | PanelOf<'state-timeline', StateTimeline.Options, StateTimeline.FieldConfig>;
type Row = Omit<S.RowPanel, 'panels'> & { panels: Array<KnownPanel> };
export type Dashboard = Json<Omit<S.Dashboard, 'panels'> & { panels?: Array<KnownPanel | Row> }>;
