/** The app's `@workflow/world`, loaded once: its module, its version and its entry file. */
export declare function sdkWorld(): { module: Record<string, unknown>; version: string | undefined; entry: string };
