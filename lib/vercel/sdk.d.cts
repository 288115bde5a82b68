/** `@workflow/world`, loaded once. */
export declare function loadSdkWorld(): Promise<typeof import('@workflow/world')>;
