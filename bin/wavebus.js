#!/usr/bin/env node
'use strict';
require('../dist/src/cli.js').main(process.argv.slice(2));
