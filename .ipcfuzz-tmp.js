const path=require('path'),fs=require('fs'),os=require('os');
const {spawn}=require('child_process');
const zmq=require('/work/main/node_modules/zeromq');
const F=require('/work/main/dist/bench/fuzz.js');
const {agentEndpoint}=require('/work/main/dist/src/paths');
(async()=>{
  const dir=fs.mkdtempSync('/tmp/ipcf-');
  const ag=spawn(process.execPath,['/work/main/bin/wavebus.js','agent','--coordinator','127.0.0.1:39999','--rank','0','--world-size','1','--tp','1','--run-dir',dir],{stdio:['ignore','inherit','inherit']});
  await new Promise(r=>setTimeout(r,1500));
  const m=new F.Mutator(Number(process.argv[2]||1)); const corpus=F.clientCorpus();
  const d=new zmq.Dealer({linger:0}); d.connect(agentEndpoint(dir,0));
  let got=0; (async()=>{for await (const x of d) got++;})();
  let exp=0; const N=Number(process.argv[3]||300);
  const bodies={};
  for(let i=0;i<N;i++){const parts=m.parts(()=>m.mutate(m.pick(corpus)),1); if(F.clientAnswers(parts)){exp++; try{const b=require('/work/main/dist/src/proto').decode(require('/work/main/dist/src/proto').ClientRequest,parts[0]).body; bodies[b]=(bodies[b]||0)+1;}catch{}} await d.send(parts);}
  for(let t=0;t<50&&got<exp;t++) await new Promise(r=>setTimeout(r,100));
  console.log('expected',exp,'got',got,bodies);
  ag.kill('SIGKILL'); d.close(); process.exit(0);
})();
